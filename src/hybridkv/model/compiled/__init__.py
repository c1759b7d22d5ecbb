"""Compiled decode steps: a model's decode step planned once into a flat program of kernel
calls (``native/runner.c``) and run in one native call per step (``program.py``)."""

"""Tool calling as vLLM does it: one parser per model family's format (``registry.py``), the
``tool_choice`` rules and constraints (``choice.py``), and streaming the calls (``stream.py``)."""

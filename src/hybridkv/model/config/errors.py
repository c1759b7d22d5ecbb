"""Errors raised while reading a checkpoint."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A checkpoint directory cannot be loaded; the message names the file or tensor at fault."""

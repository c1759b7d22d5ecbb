"""Leaf helpers every layer may use: byte sizes in options, and where hybridkv caches files.

Imports nothing of hybridkv, so ``native/``, the connectors' option parsers and ``config`` can
all share it without importing each other.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
          "tb": 1000**4, "tib": 1024**4}  # fmt: skip


def parse_bytes(value: int | str, name: str = "size") -> int:
    """``4096``, ``"512MiB"``, ``"4GiB"``, ``"1.5GB"`` -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(
                f"invalid {name} {value!r}: expected bytes like 4096, '512MiB' or '4GiB'"
            )
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise ValueError(f"invalid {name} {value!r}: must be positive")
    return n


def cache_dir() -> Path:
    """``$HYBRIDKV_CACHE_DIR``, default ``~/.cache/hybridkv``: the default model, compiled
    native kernels and benchmark checkpoints live under it."""
    root = os.environ.get("HYBRIDKV_CACHE_DIR") or Path.home() / ".cache" / "hybridkv"
    return Path(root)

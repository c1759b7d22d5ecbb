"""The embedded default model: a tiny Granite 4.0-H-style hybrid, made on first use."""

from __future__ import annotations

import sys
from pathlib import Path

from hybridkv.paths import cache_dir

DEFAULT_ARCH = "granitemoehybrid"
DEFAULT_NAME = "default-granite-4.0-h-tiny-v1"


def ensure_default_model() -> Path:
    """The default checkpoint's directory; built (once, atomically) if missing."""
    from hybridkv.model.loading.make_model import ensure_model

    target = cache_dir() / DEFAULT_NAME
    if ensure_model(DEFAULT_ARCH, target, size="tiny", seed=0):
        print(
            "hybridkv: created the embedded default model (tiny random-weight Granite "
            f"4.0-H-style hybrid) at {target}",
            file=sys.stderr,
        )
    return target

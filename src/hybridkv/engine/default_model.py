"""The embedded default model: a tiny Granite 4.0-H-style hybrid, made on first use."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_ARCH = "granitemoehybrid"
DEFAULT_NAME = "default-granite-4.0-h-tiny-v1"


def cache_dir() -> Path:
    root = os.environ.get("HYBRIDKV_CACHE_DIR") or Path.home() / ".cache" / "hybridkv"
    return Path(root)


def ensure_default_model() -> Path:
    """The default checkpoint's directory; built (once, atomically) if missing."""
    target = cache_dir() / DEFAULT_NAME
    if (target / "config.json").exists():
        return target
    from hybridkv.model.make_model import make_model

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        make_model(DEFAULT_ARCH, tmp, size="tiny", seed=0)
        try:
            tmp.rename(target)
        except OSError:  # another process won the race
            if not (target / "config.json").exists():
                raise
        print(
            f"hybridkv: created the embedded default model (tiny random-weight Granite 4.0-H-style hybrid) at {target}",
            file=sys.stderr,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target

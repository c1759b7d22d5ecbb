"""A GGUF file seen as a checkpoint directory: ``hybridkv serve model.gguf``.

The file's metadata becomes the files a Hugging Face checkpoint has (``config.json``,
``generation_config.json``, the tokenizer files and chat template: ``config``,
``tokenizer``), written once into ``$HYBRIDKV_CACHE_DIR/gguf/<key>/`` beside a symbolic
link ``model.gguf`` to the file itself; the key covers the file's path, size and modification
time and this module's format version, so an edited file gets a fresh view. Everything after
(config validation, the tokenizer, the engine) reads that directory as it reads any other;
the loader fills the weights from ``model.gguf`` (``weights``), memory-mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from hybridkv.model.loading.gguf.config import gguf_config_json
from hybridkv.model.loading.gguf.file import GgufFile
from hybridkv.model.loading.gguf.tokenizer import write_gguf_tokenizer
from hybridkv.paths import cache_dir

GGUF_FILE = "model.gguf"
VIEW_VERSION = "1"


def is_gguf_path(model: str) -> bool:
    return model.endswith(".gguf") and Path(model).expanduser().is_file()


def gguf_model_dir(path: Path) -> Path:
    """The checkpoint directory that stands for GGUF file ``path`` (made on first use)."""
    path = path.expanduser().resolve()
    view = view_dir(path)
    key = view.name
    if (view / GGUF_FILE).exists():
        return view
    view.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=view.parent))
    try:
        _write_view(GgufFile(path), staging)
        os.symlink(path, staging / GGUF_FILE)
        os.replace(staging, view)  # NOTE: fails if a concurrent process made it first: fine
    except OSError:
        if not (view / GGUF_FILE).exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return view


def view_dir(path: Path) -> Path:
    """Where the view of GGUF file ``path`` is (or would be)."""
    path = path.expanduser().resolve()
    stat = path.stat()
    key = f"{VIEW_VERSION}|{path}|{stat.st_size}|{stat.st_mtime_ns}"
    return cache_dir() / "gguf" / hashlib.sha256(key.encode()).hexdigest()[:24]


def _write_view(file: GgufFile, out_dir: Path) -> None:
    config = gguf_config_json(file)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    eos = config.get("eos_token_id")
    generation = {"eos_token_id": eos} if eos is not None else {}
    (out_dir / "generation_config.json").write_text(json.dumps(generation))
    write_gguf_tokenizer(file, out_dir)

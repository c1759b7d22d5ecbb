"""Models by name: ``org/name`` resolves to a snapshot already in the local Hugging Face cache;
a ``*.gguf`` file to its view directory (``gguf.view``).

Nothing is downloaded. The cache root is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub`` (read at every call, so a changed environment is honoured);
``huggingface_hub`` reads its layout (``models--org--name/refs/main`` ->
``snapshots/<commit>``) in offline mode. An optional ``@revision`` suffix picks a branch, tag
or commit.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.loading.gguf.view import gguf_model_dir, is_gguf_path

_REPO_ID = re.compile(r"^[\w.\-]+/[\w.\-]+(@[\w.\-/]+)?$")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache this process would read."""
    explicit = os.environ.get("HF_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME")
    root = Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface"
    return root / "hub"


def resolve_model_dir(model: str) -> Path:
    """A checkpoint directory for ``model``: an existing directory as is, an ``org/name``
    (optionally ``@revision``) from the local hub cache; anything else is an error that says
    where it looked."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if is_gguf_path(model):  # a GGUF file: its metadata as a checkpoint directory
        return gguf_model_dir(path)
    if not _REPO_ID.match(model) or model.startswith((".", "/")):
        raise ModelLoadError(f"model directory {model!r} does not exist")
    repo_id, _, revision = model.partition("@")
    return _cached_snapshot(repo_id, revision or None)


def _cached_snapshot(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:
        found = snapshot_download(
            repo_id, revision=revision, cache_dir=cache, local_files_only=True
        )
    except (LocalEntryNotFoundError, FileNotFoundError):
        where = cache / f"models--{repo_id.replace('/', '--')}"
        raise ModelLoadError(
            f"model {repo_id!r}{' at ' + revision if revision else ''} is neither a directory "
            f"nor in the local Hugging Face cache ({where} not found; hybridkv never downloads: "
            f"fetch it first, e.g. `hf download {repo_id}`, or set HF_HUB_CACHE / HF_HOME)"
        ) from None
    return Path(str(found))

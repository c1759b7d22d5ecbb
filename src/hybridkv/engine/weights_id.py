"""The identity of a checkpoint: KV computed from other bytes must never be loaded.

It covers every byte of every ``*.safetensors`` file, ``config.json`` (every field: any of them
may change the numbers) and the tokenizer files. Reading a checkpoint of many GB takes
seconds, so each file's digest is computed once per file version and kept in
``<cache dir>/file-digests.json``, keyed by the file's absolute path, size, modification time
(ns) and inode: rewriting or replacing a file gives a new key, so a stale digest is never used.
A cache that cannot be read or written only costs the hashing again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

IDENTITY_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
)
DIGEST_CACHE = "file-digests.json"
MAX_CACHED_FILES = 4096  # the oldest entries go first beyond this
ANNOUNCE_BYTES = 1 << 30


def weights_identity(model_dir: str | Path, cache_dir: Path | None) -> str:
    """A digest of every identity file of ``model_dir`` (names and contents); ``cache_dir``
    keeps per-file digests between runs (None: hash everything every time)."""
    root = Path(model_dir)
    files = sorted(root.glob("*.safetensors")) + [
        root / name for name in IDENTITY_FILES if (root / name).is_file()
    ]
    cache = _DigestCache(cache_dir / DIGEST_CACHE if cache_dir is not None else None)
    h = hashlib.sha256(b"hybridkv/weights-identity/v2")
    for path in files:
        h.update(f"{path.name}:{cache.digest(path)}\n".encode())
    cache.save()
    return h.hexdigest()[:32]


def file_digest(path: Path) -> str:
    size = path.stat().st_size
    if size >= ANNOUNCE_BYTES:  # ~0.5 GB/s: say why start-up waits, once per file version
        print(
            f"hybridkv: hashing {path.name} ({size / 2**30:.1f} GiB) once for the KV cache "
            "identity (cached for later starts)",
            file=sys.stderr,
        )
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class _DigestCache:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, str] = self._load()
        self.dirty = False

    def digest(self, path: Path) -> str:
        st = path.stat()
        key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
        found = self.entries.get(key)
        if found is None:
            found = self.entries[key] = file_digest(path)
            self.dirty = True
        return found

    def _load(self) -> dict[str, str]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            logger.warning("ignoring the unreadable digest cache %s", self.path)
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}

    def save(self) -> None:
        """Atomically (a temporary file renamed over it): concurrent writers lose entries at
        worst, never corrupt the file."""
        if self.path is None or not self.dirty:
            return
        entries = dict(list(self.entries.items())[-MAX_CACHED_FILES:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".file-digests.")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(entries, f)
                os.replace(tmp, self.path)
            finally:
                Path(tmp).unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("cannot save the digest cache %s: %s", self.path, exc)

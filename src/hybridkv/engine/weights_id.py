"""The identity of a checkpoint: KV computed from other bytes must never be loaded.

It covers every byte of every ``*.safetensors`` file (a GGUF view's ``model.gguf``: the file
it links to), ``config.json`` (every field: any of them
may change the numbers) and the tokenizer files, each hashed whole with SHA-256.

Reading a checkpoint of 10 GB takes 20 s at SHA-256's ~0.5 GB/s, so each file's digest is kept
in ``<cache dir>/file-digests.json`` under a key naming the file *version*: its absolute path,
device, inode, size, modification time and **change time** (all in ns). The change time is what
makes the key safe: the kernel sets it to the current time on every write, truncation, rename
or attribute change, and no unprivileged process can set it back -- ``touch -d`` / ``os.utime``
restore the mtime but bump the ctime. So an in-place edit of the same size with its mtime
restored (issue 26: it once kept the old identity) gets a new key and is hashed again, at no
start-up cost for an unchanged checkpoint. A digest is cached only if the file's stat is the
same before and after hashing and its ctime is at least ``RACY_SECONDS`` old (git's "racy"
rule: a write in the same clock tick as the stat would leave the ctime unchanged), so a file
being written meanwhile is hashed again next time.

Not covered, by design: root rewriting the block device or moving the clock back, and a
filesystem whose ctime does not follow writes made elsewhere (some FUSE or network mounts):
there, delete ``file-digests.json`` after editing weights in place, or set
``HYBRIDKV_CACHE_DIR`` to an empty directory to hash everything. A cache that cannot be read or
written only costs the hashing again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
import time
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
RACY_SECONDS = 2.0  # a file changed this recently is hashed but its digest not cached
MAX_CACHED_FILES = 4096  # the oldest entries go first beyond this
ANNOUNCE_BYTES = 1 << 30


def model_identity(model_dir: str | Path, architecture: str, dtype: str, bf16_matmul: str) -> str:
    """What KV from another engine must match to be loaded: the architecture, the identity of
    the weights, tokenizer and config (every byte, digests cached per file version), how this
    process multiplies, and the dtype."""
    import torch

    from hybridkv.model.loading.matmul import matmul_dtype
    from hybridkv.paths import cache_dir

    compute = matmul_dtype(getattr(torch, dtype), bf16_matmul)
    weights = weights_identity(model_dir, cache_dir())
    return f"{architecture}:{weights}:matmul={compute}:{dtype}"


def weights_identity(model_dir: str | Path, cache_dir: Path | None) -> str:
    """A digest of every identity file of ``model_dir`` (names and contents); ``cache_dir``
    keeps per-file digests between runs (None: hash everything every time)."""
    root = Path(model_dir)
    files = (
        sorted(root.glob("*.safetensors"))
        + sorted(root.glob("*.gguf"))
        + [root / name for name in IDENTITY_FILES if (root / name).is_file()]
    )
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


def _version_key(path: Path) -> str:
    """What changes whenever the file's bytes may have (see the module docstring)."""
    st = path.stat()
    version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return f"v3|{path.resolve()}|" + "|".join(map(str, version))


class _DigestCache:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.entries: dict[str, str] = self._load()
        self.dirty = False

    def digest(self, path: Path) -> str:
        key = _version_key(path)
        found = self.entries.get(key)
        if found is not None:
            return found
        found = file_digest(path)
        settled = time.time_ns() - path.stat().st_ctime_ns > RACY_SECONDS * 1e9
        if settled and _version_key(path) == key:  # not written while (or just before) hashing
            self.entries[key] = found
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

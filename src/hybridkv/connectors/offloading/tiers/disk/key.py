"""A disk-tier directory's secret key: MACs, the payload digest seed, keyed file names.

``<disk_path>/.hybridkv-key`` holds 32 random bytes, created 0600 atomically on first use
(``DirectoryKey.load_or_create``; processes that share the directory race safely and all use
the winner's key). Contract: a key file that is not a private regular file of this user, or
not 32 bytes, is refused with ``ValueError`` naming the path; the key never leaves this
process (only ``key_id``, a keyed hash of it, is written into part headers).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Sequence

import xxhash

MAC_BYTES = 32
KEY_FILE = ".hybridkv-key"
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class DirectoryKey:
    """A cache directory's secret: MACs, payload digest seed, and keyed file names."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self.key_id = hashlib.blake2b(b"key-id", key=secret, digest_size=8).digest()
        seed = hashlib.blake2b(b"payload-seed", key=secret, digest_size=8).digest()
        self._seed = int.from_bytes(seed, "little")

    @classmethod
    def load_or_create(cls, directory: str, name: str = KEY_FILE) -> DirectoryKey:
        """The key in ``directory/name`` (created 0600 on first use, atomically). Raises
        ``ValueError`` if the key file is not a private regular file of this user."""
        path = os.path.join(directory, name)
        with contextlib.suppress(FileNotFoundError):
            return cls(_read_key(path))
        tmp = f"{path}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(32))
            with contextlib.suppress(FileExistsError):  # another process won the race
                os.link(tmp, path)
        finally:
            unlink_quietly(tmp)
        return cls(_read_key(path))

    def mac(self, data: bytes) -> bytes:
        return hashlib.blake2b(data, key=self._secret, digest_size=MAC_BYTES).digest()

    def digest(self, payload: memoryview) -> bytes:
        return xxhash.xxh3_128_digest(payload, seed=self._seed)

    def digest_pieces(self, pieces: Sequence[bytes | memoryview]) -> bytes:
        """``digest`` of the pieces joined, without joining them."""
        h = xxhash.xxh3_128(seed=self._seed)
        for piece in pieces:
            h.update(piece)
        return h.digest()

    def keyed_name(self, text: str) -> str:
        """A keyed hash of ``text`` (40 hex digits): names no one without the key can derive."""
        name = hashlib.blake2b(text.encode(), key=self._secret, digest_size=20, person=b"name")
        return name.hexdigest()

    def file_name(self, part_key: str) -> str:
        """The file name of a part: a keyed hash, so a listing reveals no token hash."""
        return self.keyed_name(part_key) + ".kvu"


def _read_key(path: str) -> bytes:
    fd = os.open(path, OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise ValueError(f"{path}: not a regular file owned by this user")
        if info.st_mode & 0o077:
            raise ValueError(
                f"{path}: readable by others (mode {info.st_mode & 0o777:o}); use 0600"
            )
        secret = os.read(fd, 64)
    finally:
        os.close(fd)
    if len(secret) != 32:
        raise ValueError(f"{path}: {len(secret)} bytes, a key has 32")
    return secret


def unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

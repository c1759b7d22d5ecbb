"""Secrets read from files (the server's API key, the NIXL and remote-tier deployment keys):
one reader, one set of rules.

A secret file must be a regular file (a symlink to one is fine: mounted secrets are), not
readable by others (mode ``0600`` or ``0640``), and hold ``min_bytes`` to ``MAX_SECRET_BYTES``
once surrounding whitespace is stripped; at most ``MAX_SECRET_BYTES + 1`` bytes are read, so
pointing the option at a huge file or a device costs nothing. Anything else is a
``ValueError`` whose message starts with ``what`` (the option, as the caller names it) and says
what to do. The secret itself never appears in a message.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_SECRET_BYTES = 4096
HINT = " (e.g. `openssl rand -hex 32 > FILE; chmod 600 FILE`)"


def read_secret_file(path: str | Path, what: str, min_bytes: int = 1) -> bytes:
    """The stripped secret in ``path``; ``ValueError`` starting with ``what`` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{what}: {path} is not a regular file")
        if info.st_mode & 0o007:
            mode = info.st_mode & 0o777
            raise ValueError(f"{what}: {path} is readable by others (mode {mode:o}); chmod 600 it")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    return check_secret(data, f"{path}", what, min_bytes)


def check_secret(data: bytes, where: str, what: str, min_bytes: int = 1) -> bytes:
    """``data`` stripped, if ``min_bytes`` to ``MAX_SECRET_BYTES`` long; else a ``ValueError``
    starting with ``what`` naming ``where`` (a path or an environment variable)."""
    secret = data.strip()
    if not min_bytes <= len(secret) <= MAX_SECRET_BYTES:
        empty = "is empty" if not secret else f"holds {len(secret)} bytes"
        raise ValueError(
            f"{what}: {where} {empty}; it needs {min_bytes} to {MAX_SECRET_BYTES}"
            + (HINT if min_bytes > 1 else "")
        )
    return secret

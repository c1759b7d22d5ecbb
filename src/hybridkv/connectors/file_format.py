"""On-disk format of one stored KV part: one block of an attention group, or one state checkpoint.

::

    offset  size  field
    0       4     magic b"HKVF"
    4       2     format version (u16 LE)
    6       2     len(fingerprint) in bytes (u16)
    8       2     len(key) in bytes (u16)
    10      8     token span start (u64)
    18      8     token span end (u64)
    26      8     payload length (u64)
    34      32    SHA-256 of the payload
    66      ...   fingerprint (utf-8), key (utf-8), then the payload

A file is written under a temporary name in its final directory and renamed into place, so a
reader sees either nothing or a whole file. A reader checks everything it can: a file that fails
any check is a ``PartError`` with a reason, never bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import tempfile

MAGIC = b"HKVF"
FORMAT_VERSION = 1
_HEAD = struct.Struct("<4sHHHQQQ32s")

# Load failure reasons (also the suffix of the ``load_failures:<reason>`` counters).
MISSING = "missing"  # no such file
TRUNCATED = "truncated"  # shorter than its header says
CORRUPT = "corrupt"  # bad magic, checksum mismatch, trailing bytes, undecodable header
MISMATCH = "mismatch"  # a valid file of another version, fingerprint, key, span or size
IO_ERROR = "io_error"  # the file could not be read


class PartError(Exception):
    """A stored part that cannot be used; ``reason`` is one of the constants above."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def write_part(
    path: str, fingerprint: str, key: str, span: tuple[int, int], payload: bytes | memoryview
) -> int:
    """Atomically write one part at ``path``; returns the payload length.

    On any failure the temporary file is removed and the exception propagates; ``path`` is
    then either absent or still holds what it held before."""
    view = memoryview(payload).cast("B")  # flat bytes whatever the source shape
    fp_bytes, key_bytes = fingerprint.encode(), key.encode()
    head = _HEAD.pack(
        MAGIC,
        FORMAT_VERSION,
        len(fp_bytes),
        len(key_bytes),
        span[0],
        span[1],
        view.nbytes,
        hashlib.sha256(view).digest(),
    )
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head + fp_bytes + key_bytes)
            f.write(view)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return view.nbytes


def read_part(
    path: str, fingerprint: str, key: str, span: tuple[int, int], payload_len: int
) -> memoryview:
    """Read and verify the whole part at ``path``; returns its payload or raises ``PartError``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise PartError(MISSING, path) from None
    except OSError as exc:
        raise PartError(IO_ERROR, str(exc)) from None
    return _parse(memoryview(data), fingerprint, key, span, payload_len)


def _parse(
    data: memoryview, fingerprint: str, key: str, span: tuple[int, int], payload_len: int
) -> memoryview:
    if data.nbytes < _HEAD.size:
        raise PartError(TRUNCATED, f"{data.nbytes} bytes, header needs {_HEAD.size}")
    magic, version, fp_len, key_len, start, end, length, digest = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise PartError(CORRUPT, "bad magic")
    if version != FORMAT_VERSION:
        raise PartError(MISMATCH, f"format version {version}, expected {FORMAT_VERSION}")
    names_end = _HEAD.size + fp_len + key_len
    if data.nbytes < names_end + length:
        raise PartError(TRUNCATED, f"{data.nbytes} bytes, header says {names_end + length}")
    if data.nbytes > names_end + length:
        raise PartError(CORRUPT, "trailing bytes")
    try:
        file_fp = bytes(data[_HEAD.size : _HEAD.size + fp_len]).decode()
        file_key = bytes(data[_HEAD.size + fp_len : names_end]).decode()
    except UnicodeDecodeError:
        raise PartError(CORRUPT, "undecodable header") from None
    if (file_fp, file_key, (start, end)) != (fingerprint, key, span):
        raise PartError(MISMATCH, f"holds {file_fp}/{file_key} [{start}, {end})")
    payload = data[names_end:]
    if hashlib.sha256(payload).digest() != digest:
        raise PartError(CORRUPT, "checksum mismatch")
    if length != payload_len:
        raise PartError(MISMATCH, f"payload of {length} bytes, layout needs {payload_len}")
    return payload


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

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
    34      32    checksum of the payload: SHA-256 (version 1) or xxh3-128, zero padded (version 2)
    66      ...   fingerprint (utf-8), key (utf-8), then the payload

Version 2 differs from version 1 only in the checksum: xxh3-128 runs at memory speed, so bulk
tiers (the offloading connector's disk tier) can verify every load; readers accept both.

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
from dataclasses import dataclass

import xxhash

from hybridkv.step_io import FailureReason

MAGIC = b"HKVF"
FORMAT_VERSION = 1  # SHA-256 checksum
FORMAT_VERSION_XXH3 = 2  # xxh3-128 checksum
CHECKSUM_VERSIONS = {"sha256": FORMAT_VERSION, "xxh3": FORMAT_VERSION_XXH3}
_HEAD = struct.Struct("<4sHHHQQQ32s")

# Load failure reasons (``FailureReason`` members; stats count them by reason).
MISSING = FailureReason.MISSING  # no such file
TRUNCATED = FailureReason.TRUNCATED
CORRUPT = FailureReason.CORRUPT
MISMATCH = FailureReason.MISMATCH
IO_ERROR = FailureReason.IO_ERROR


class PartError(Exception):
    """A stored part that cannot be used; ``reason`` is one of the constants above."""

    def __init__(self, reason: FailureReason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def _digest(version: int, payload: memoryview) -> bytes:
    if version == FORMAT_VERSION_XXH3:
        return xxhash.xxh3_128_digest(payload).ljust(32, b"\0")
    return hashlib.sha256(payload).digest()


@dataclass(frozen=True, slots=True)
class PartHeader:
    """What a part's header says (``read_header``); the payload starts at ``payload_offset``."""

    version: int
    fingerprint: str
    key: str
    span: tuple[int, int]
    payload_len: int
    payload_offset: int


def write_part(
    path: str,
    fingerprint: str,
    key: str,
    span: tuple[int, int],
    payload: bytes | memoryview,
    checksum: str = "sha256",
) -> int:
    """Atomically write one part at ``path``; returns the payload length. ``checksum`` is
    ``"sha256"`` (format version 1) or ``"xxh3"`` (version 2).

    On any failure the temporary file is removed and the exception propagates; ``path`` is
    then either absent or still holds what it held before."""
    view = memoryview(payload).cast("B")  # flat bytes whatever the source shape
    version = CHECKSUM_VERSIONS[checksum]
    fp_bytes, key_bytes = fingerprint.encode(), key.encode()
    head = _HEAD.pack(
        MAGIC,
        version,
        len(fp_bytes),
        len(key_bytes),
        span[0],
        span[1],
        view.nbytes,
        _digest(version, view),
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
        with open(path, "rb", buffering=0) as f:
            data = bytearray(os.fstat(f.fileno()).st_size)  # writable: tensors can share it
            size = f.readinto(data)
    except FileNotFoundError:
        raise PartError(MISSING, path) from None
    except OSError as exc:
        raise PartError(IO_ERROR, str(exc)) from None
    return _parse(memoryview(data)[:size], fingerprint, key, span, payload_len)


def read_header(path: str) -> PartHeader:
    """Read and check only the header at ``path`` (start-up indexing); the file's size must be
    the one the header announces. Raises ``PartError``."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD.size)
            magic, version, fp_len, key_len, start, end, length, _ = _unpack(head)
            names = f.read(fp_len + key_len)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise PartError(MISSING, path) from None
    except OSError as exc:
        raise PartError(IO_ERROR, str(exc)) from None
    if len(names) < fp_len + key_len:
        raise PartError(TRUNCATED, "header names cut short")
    offset = _HEAD.size + fp_len + key_len
    if size != offset + length:
        reason = TRUNCATED if size < offset + length else CORRUPT
        raise PartError(reason, f"{size} bytes, header says {offset + length}")
    try:
        fp, key = names[:fp_len].decode(), names[fp_len:].decode()
    except UnicodeDecodeError:
        raise PartError(CORRUPT, "undecodable header") from None
    return PartHeader(version, fp, key, (start, end), length, offset)


def _unpack(head: bytes) -> tuple[bytes, int, int, int, int, int, int, bytes]:
    if len(head) < _HEAD.size:
        raise PartError(TRUNCATED, f"{len(head)} bytes, header needs {_HEAD.size}")
    fields: tuple[bytes, int, int, int, int, int, int, bytes] = _HEAD.unpack_from(head)
    if fields[0] != MAGIC:
        raise PartError(CORRUPT, "bad magic")
    if fields[1] not in CHECKSUM_VERSIONS.values():
        raise PartError(MISMATCH, f"format version {fields[1]}, expected one of (1, 2)")
    return fields


def _parse(
    data: memoryview, fingerprint: str, key: str, span: tuple[int, int], payload_len: int
) -> memoryview:
    _, version, fp_len, key_len, start, end, length, digest = _unpack(bytes(data[: _HEAD.size]))
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
    if _digest(version, payload) != digest:
        raise PartError(CORRUPT, "checksum mismatch")
    if length != payload_len:
        raise PartError(MISMATCH, f"payload of {length} bytes, layout needs {payload_len}")
    return payload


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

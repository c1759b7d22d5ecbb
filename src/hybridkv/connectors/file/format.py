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
any check is a ``PartError`` with a reason, never bytes. Readers open regular files only
(``O_NOFOLLOW | O_NONBLOCK``) and check sizes against the header before reading a payload.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
import struct
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from hybridkv.connectors.part_error import CORRUPT as CORRUPT
from hybridkv.connectors.part_error import IO_ERROR as IO_ERROR
from hybridkv.connectors.part_error import MISMATCH as MISMATCH
from hybridkv.connectors.part_error import MISSING as MISSING
from hybridkv.connectors.part_error import TRUNCATED as TRUNCATED
from hybridkv.connectors.part_error import PartError as PartError

MAGIC = b"HKVF"
FORMAT_VERSION = 1  # SHA-256 checksum
FORMAT_VERSION_XXH3 = 2  # xxh3-128 checksum
CHECKSUM_VERSIONS = {"sha256": FORMAT_VERSION, "xxh3": FORMAT_VERSION_XXH3}
_HEAD = struct.Struct("<4sHHHQQQ32s")


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
    checksum: bytes = b""


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
    head = encode_header(fingerprint, key, span, view, checksum)
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            f.write(view)
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return view.nbytes


def encode_header(
    fingerprint: str,
    key: str,
    span: tuple[int, int],
    payload: memoryview,
    checksum: str = "sha256",
) -> bytes:
    """The header (fixed fields, fingerprint, key) that precedes ``payload`` (flat bytes) in a
    stored part: header + payload is what ``parse_part`` reads back."""
    version = CHECKSUM_VERSIONS[checksum]
    fp_bytes, key_bytes = fingerprint.encode(), key.encode()
    head = _HEAD.pack(
        MAGIC,
        version,
        len(fp_bytes),
        len(key_bytes),
        span[0],
        span[1],
        payload.nbytes,
        _digest(version, payload),
    )
    return head + fp_bytes + key_bytes


def parse_part(
    head: bytes | memoryview,
    pieces: Sequence[bytes | memoryview],
    fingerprint: str,
    key: str,
    span: tuple[int, int],
    payload_len: int,
) -> bytes | memoryview:
    """Check a whole stored part held in memory as its header (``encode_header``'s bytes) and
    its payload in ``pieces`` (e.g. remote values, in order); returns the payload, or raises
    ``PartError``. The checksum streams over the pieces: one piece is returned as it is (no
    copy), several are joined once."""
    head = memoryview(head).cast("B")
    if head.nbytes < _HEAD.size:
        raise PartError(TRUNCATED, "header cut short")
    _, version, fp_len, key_len, start, end, length, checksum = _unpack(bytes(head[: _HEAD.size]))
    offset = _HEAD.size + fp_len + key_len
    if head.nbytes != offset:
        raise PartError(TRUNCATED if head.nbytes < offset else CORRUPT, "header names")
    try:
        names = bytes(head[_HEAD.size : offset])
        head_fp, head_key = names[:fp_len].decode(), names[fp_len:].decode()
    except UnicodeDecodeError:
        raise PartError(CORRUPT, "undecodable header") from None
    header = PartHeader(version, head_fp, head_key, (start, end), length, offset, checksum)
    _check_expected(header, fingerprint, key, span, payload_len)
    got = sum(memoryview(p).nbytes for p in pieces)
    if got != length:
        reason = TRUNCATED if got < length else CORRUPT
        raise PartError(reason, f"{got} payload bytes, header says {length}")
    if _digest_pieces(version, pieces) != checksum:
        raise PartError(CORRUPT, "checksum mismatch")
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _digest_pieces(version: int, pieces: Sequence[bytes | memoryview]) -> bytes:
    if len(pieces) == 1:
        return _digest(version, memoryview(pieces[0]))
    h: Any = xxhash.xxh3_128() if version == FORMAT_VERSION_XXH3 else hashlib.sha256()
    for piece in pieces:
        h.update(piece)
    return bytes(h.digest()).ljust(32, b"\0")


def _check_expected(
    head: PartHeader, fingerprint: str, key: str, span: tuple[int, int], payload_len: int
) -> None:
    """The header names what the caller expects (fingerprint, key, span, size)."""
    if (head.fingerprint, head.key, head.span) != (fingerprint, key, span):
        raise PartError(MISMATCH, f"holds {head.fingerprint}/{head.key} {list(head.span)}")
    if head.payload_len != payload_len:
        raise PartError(
            MISMATCH, f"payload of {head.payload_len} bytes, layout needs {payload_len}"
        )


def read_part(
    path: str, fingerprint: str, key: str, span: tuple[int, int], payload_len: int
) -> memoryview:
    """Read and verify the part at ``path``; returns its payload or raises ``PartError``.

    Only a regular file is opened, never through a symlink and never blocking (a FIFO planted
    at ``path`` is refused at once, not waited on). The header is checked against what the
    caller expects before the payload is read, and the file's size against the header: no
    more than ``payload_len`` bytes are ever allocated, whatever the file says."""
    with _open_regular(path) as f:
        head = _read_head(f)
        _check_expected(head, fingerprint, key, span, payload_len)
        _check_size(f, head)
        data = bytearray(payload_len)  # writable: tensors can share it
        try:
            got = f.readinto(data)
        except OSError as exc:
            raise PartError(IO_ERROR, str(exc)) from None
        if got != payload_len:
            raise PartError(TRUNCATED, f"payload cut short at {got} of {payload_len} bytes")
    payload = memoryview(data)
    if _digest(head.version, payload) != head.checksum:
        raise PartError(CORRUPT, "checksum mismatch")
    return payload


def read_header(path: str) -> PartHeader:
    """Read and check only the header at ``path`` (start-up indexing); the file's size must be
    the one the header announces. Raises ``PartError``."""
    with _open_regular(path) as f:
        head = _read_head(f)
        _check_size(f, head)
    return head


@contextlib.contextmanager
def _open_regular(path: str) -> Iterator[io.FileIO]:
    """``path`` opened for reading if it is a regular file, not a symlink; ``PartError``
    otherwise (a FIFO, device, directory or symlink is ``CORRUPT``: not a part)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise PartError(MISSING, path) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PartError(CORRUPT, "a symlink, not a part") from None
        raise PartError(IO_ERROR, str(exc)) from None
    with io.FileIO(fd, "rb", closefd=True) as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PartError(CORRUPT, "not a regular file")
        yield f


def _read_head(f: io.FileIO) -> PartHeader:
    try:
        raw = f.read(_HEAD.size)
        magic, version, fp_len, key_len, start, end, length, checksum = _unpack(raw)
        names = f.read(fp_len + key_len)
    except OSError as exc:
        raise PartError(IO_ERROR, str(exc)) from None
    if len(names) < fp_len + key_len:
        raise PartError(TRUNCATED, "header names cut short")
    try:
        fp, key = names[:fp_len].decode(), names[fp_len:].decode()
    except UnicodeDecodeError:
        raise PartError(CORRUPT, "undecodable header") from None
    offset = _HEAD.size + fp_len + key_len
    return PartHeader(version, fp, key, (start, end), length, offset, checksum)


def _check_size(f: io.FileIO, head: PartHeader) -> None:
    size = os.fstat(f.fileno()).st_size
    want = head.payload_offset + head.payload_len
    if size < want:
        raise PartError(TRUNCATED, f"{size} bytes, header says {want}")
    if size > want:
        raise PartError(CORRUPT, f"trailing bytes: {size} bytes, header says {want}")


def _unpack(head: bytes) -> tuple[bytes, int, int, int, int, int, int, bytes]:
    if len(head) < _HEAD.size:
        raise PartError(TRUNCATED, f"{len(head)} bytes, header needs {_HEAD.size}")
    fields: tuple[bytes, int, int, int, int, int, int, bytes] = _HEAD.unpack_from(head)
    if fields[0] != MAGIC:
        raise PartError(CORRUPT, "bad magic")
    if fields[1] not in CHECKSUM_VERSIONS.values():
        raise PartError(MISMATCH, f"format version {fields[1]}, expected one of (1, 2)")
    return fields


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

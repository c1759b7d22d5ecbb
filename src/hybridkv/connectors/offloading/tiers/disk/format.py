"""The disk tier's file format (version 3): authenticated parts, opened without trusting the file.

::

    offset  size  field
    0       4     magic b"HKVF"
    4       2     format version 3 (u16 LE)
    6       2     len(fingerprint) (u16)
    8       2     len(key) (u16)
    10      2     zero
    12      8     key id: which directory key wrote it (``DirectoryKey.key_id``)
    20      8     token span start (u64)
    28      8     token span end (u64)
    36      8     payload length (u64)
    44      16    xxh3-128 of the payload, seeded from the directory key
    60      ...   fingerprint (utf-8), key (utf-8)
    ...     32    MAC: keyed BLAKE2b-256 of every byte above
    ...     ...   payload

The MAC binds the header (fingerprint, part key, span, length) and the payload digest to the
directory's secret key, so a file another directory (or someone without the key) made is
refused (``FOREIGN`` / ``FORGED``) before its payload is read. Versions 1-2 (FileConnector's
``file.format``) are ``MISMATCH`` here.

The directory's secret (``DirectoryKey``) lives in ``tiers.disk.key``.

Every open is ``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file (``fstat``), so a symlink,
FIFO, socket or device at a part's path is refused (``UNSAFE``) without blocking, and the file's
size is checked against what the caller expects before anything is allocated or read.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import socket
import stat
import struct
from dataclasses import dataclass

from hybridkv.connectors.offloading.tiers.disk.key import (
    MAC_BYTES,
    OPEN_FLAGS,
    DirectoryKey,
    unlink_quietly,
)
from hybridkv.connectors.part_error import CORRUPT as CORRUPT
from hybridkv.connectors.part_error import IO_ERROR as IO_ERROR
from hybridkv.connectors.part_error import MISMATCH as MISMATCH
from hybridkv.connectors.part_error import MISSING as MISSING
from hybridkv.connectors.part_error import TRUNCATED as TRUNCATED
from hybridkv.connectors.part_error import PartError as PartError
from hybridkv.step_io import FailureReason

MAGIC = b"HKVF"
VERSION = 3
_HEAD = struct.Struct("<4sHHHH8sQQQ16s")
MAX_NAME_BYTES = 4096  # fingerprint + key: anything longer is not ours

FORGED = FailureReason.FORGED  # a header our key did not authenticate
FOREIGN = FailureReason.FOREIGN  # authenticated by another directory's key
UNSAFE = FailureReason.UNSAFE  # not a regular file (symlink, FIFO, device...)
REASONS = (MISSING, TRUNCATED, CORRUPT, MISMATCH, IO_ERROR, FORGED, FOREIGN, UNSAFE)


@dataclass(frozen=True, slots=True)
class PartHeader:
    fingerprint: str
    key: str
    span: tuple[int, int]
    payload_len: int
    payload_offset: int
    digest: bytes


def encode_header(
    dkey: DirectoryKey, fingerprint: str, key: str, span: tuple[int, int], payload: memoryview
) -> bytes:
    fp, name = fingerprint.encode(), key.encode()
    head = _HEAD.pack(
        MAGIC,
        VERSION,
        len(fp),
        len(name),
        0,
        dkey.key_id,
        span[0],
        span[1],
        payload.nbytes,
        dkey.digest(payload),
    )
    body = head + fp + name
    return body + dkey.mac(body)


def open_regular(path: str) -> tuple[int, int]:
    """(fd, size) of a regular file at ``path``, never following a symlink nor blocking on a
    FIFO; ``PartError`` otherwise."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except FileNotFoundError:
        raise PartError(MISSING, path) from None
    except OSError as exc:  # ELOOP: a symlink
        raise PartError(UNSAFE if exc.errno == errno.ELOOP else IO_ERROR, str(exc)) from None
    try:
        info = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise PartError(IO_ERROR, str(exc)) from None
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise PartError(UNSAFE, f"{path}: not a regular file")
    return fd, info.st_size


def parse_header(dkey: DirectoryKey, fd: int, size: int) -> PartHeader:
    """Read and authenticate the header of an open part; its size must match the header."""
    head = _pread(fd, _HEAD.size, 0)
    if len(head) < _HEAD.size:
        raise PartError(TRUNCATED, f"{len(head)} bytes, a header needs {_HEAD.size}")
    magic, version, fp_len, key_len, _, key_id, start, end, length, digest = _HEAD.unpack(head)
    if magic != MAGIC:
        raise PartError(CORRUPT, "bad magic")
    if version != VERSION:
        raise PartError(MISMATCH, f"format version {version}, expected {VERSION}")
    if fp_len + key_len > MAX_NAME_BYTES:
        raise PartError(CORRUPT, "header names too long")
    names = _pread(fd, fp_len + key_len + MAC_BYTES, _HEAD.size)
    if len(names) < fp_len + key_len + MAC_BYTES:
        raise PartError(TRUNCATED, "header cut short")
    if key_id != dkey.key_id:
        raise PartError(FOREIGN, "written with another directory's key")
    body, mac = head + names[: fp_len + key_len], names[fp_len + key_len :]
    if not hmac.compare_digest(dkey.mac(body), mac):
        raise PartError(FORGED, "header authentication failed")
    offset = _HEAD.size + fp_len + key_len + MAC_BYTES
    if size != offset + length:
        reason = TRUNCATED if size < offset + length else CORRUPT
        raise PartError(reason, f"{size} bytes, header says {offset + length}")
    try:
        fp, key = names[:fp_len].decode(), names[fp_len : fp_len + key_len].decode()
    except UnicodeDecodeError:
        raise PartError(CORRUPT, "undecodable header") from None
    return PartHeader(fp, key, (start, end), length, offset, digest)


def read_verified(
    dkey: DirectoryKey,
    path: str,
    fingerprint: str,
    key: str,
    span: tuple[int, int],
    payload_len: int,
) -> memoryview:
    """The payload of the part at ``path``, authenticated and verified. The header (at most
    ``MAX_NAME_BYTES`` and a bit) is read first; the file's size must be what it announces and
    the payload what this part needs before anything is allocated; ``PartError`` otherwise."""
    fd, size = open_regular(path)
    try:
        head = parse_header(dkey, fd, size)  # the file's size is the header's, checked
        if (head.fingerprint, head.key, head.span) != (fingerprint, key, span):
            raise PartError(MISMATCH, f"holds {head.fingerprint}/{head.key} {head.span}")
        if head.payload_len != payload_len:
            raise PartError(MISMATCH, f"payload of {head.payload_len}, expected {payload_len}")
        data = bytearray(payload_len)  # writable: tensors can share it
        got = _readinto(fd, data, head.payload_offset)
    finally:
        os.close(fd)
    if got != payload_len:
        raise PartError(TRUNCATED, f"payload of {got} bytes, expected {payload_len}")
    payload = memoryview(data)
    if dkey.digest(payload) != head.digest:
        raise PartError(CORRUPT, "checksum mismatch")
    return payload


def write_verified(
    dkey: DirectoryKey,
    path: str,
    fingerprint: str,
    key: str,
    span: tuple[int, int],
    payload: memoryview,
) -> int:
    """Atomically write one part (a private temporary file renamed into place); returns the
    payload length. On failure the temporary file is removed and the error propagates."""
    view = payload.cast("B")
    header = encode_header(dkey, fingerprint, key, span, view)
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{tmp_owner()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(view)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    return view.nbytes


def tmp_owner() -> str:
    """``<host>-<pid>``: which process a temporary file belongs to."""
    host = hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()
    return f"{host}-{os.getpid()}"


def tmp_owner_dead(name: str) -> bool:
    """Whether a temporary file of ours was left by a process of this host that is gone."""
    parts = name.split(".")
    if len(parts) < 4 or "-" not in parts[-3]:
        return False
    host, _, pid = parts[-3].partition("-")
    if host != tmp_owner().partition("-")[0] or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, owned by another user
        return False
    return False


def _pread(fd: int, n: int, offset: int) -> bytes:
    try:
        return os.pread(fd, n, offset)
    except OSError as exc:
        raise PartError(IO_ERROR, str(exc)) from None


def _readinto(fd: int, data: bytearray, offset: int) -> int:
    view, got = memoryview(data), 0
    try:
        while got < len(data):
            n = os.preadv(fd, [view[got:]], offset + got)
            if n == 0:
                break
            got += n
    except OSError as exc:
        raise PartError(IO_ERROR, str(exc)) from None
    return got

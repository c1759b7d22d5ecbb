"""The remote tier's value format: authenticated parts under keyed names.

A part is stored as a fixed-size header value, then its payload in values of a few MiB::

    <remote_key_prefix><name>:0     header (HEADER_BYTES)
    <remote_key_prefix><name>:1..   payload pieces

    name    keyed BLAKE2b-160 of "<fingerprint>:c<chunk_tokens>:<part key>" (40 hex digits)

    header  offset  size  field
            0       4     magic b"HKVR"
            4       2     format version 1 (u16 LE)
            6       2     zero
            8       8     token span start (u64)
            16      8     token span end (u64)
            24      8     payload length (u64)
            32      16    xxh3-128 of the payload, seeded from the deployment key
            48      32    MAC: keyed BLAKE2b-256 of the 48 bytes above, the fingerprint and
                          the part key (both length-prefixed; not stored, the reader knows them)

The MAC binds the header and the payload digest to the deployment key *and* to the part it
stands for, so a value written without the key (``FORGED``), or copied from another part's
name, is refused before its payload is digested; a payload that is not the one the MAC vouches
for is ``CORRUPT``. Names are keyed too: without the key, no one can tell which prompts the
server holds (the store is no membership oracle) nor plant a value where a part will be read.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Sequence

from hybridkv.connectors.offloading.tiers.disk.key import MAC_BYTES, DirectoryKey
from hybridkv.connectors.part_error import CORRUPT, MISMATCH, TRUNCATED, PartError
from hybridkv.step_io import FailureReason

MAGIC = b"HKVR"
VERSION = 1
_HEAD = struct.Struct("<4sHHQQQ16s")
HEADER_BYTES = _HEAD.size + MAC_BYTES
FORGED = FailureReason.FORGED


def value_name(dkey: DirectoryKey, namespace: str, part_key: str) -> str:
    """The keyed part of a part's value names (``namespace``: fingerprint and chunk size)."""
    return dkey.keyed_name(f"{namespace}:{part_key}")


def encode_header(
    dkey: DirectoryKey, fingerprint: str, part_key: str, span: tuple[int, int], payload: memoryview
) -> bytes:
    """The header value of a part whose payload is ``payload`` (flat bytes)."""
    head = _HEAD.pack(MAGIC, VERSION, 0, span[0], span[1], payload.nbytes, dkey.digest(payload))
    return head + dkey.mac(_mac_input(head, fingerprint, part_key))


def parse_part(
    dkey: DirectoryKey,
    header: bytes,
    pieces: Sequence[bytes | memoryview],
    fingerprint: str,
    part_key: str,
    span: tuple[int, int],
    payload_len: int,
) -> bytes | memoryview:
    """The payload of a part read as its header value and payload ``pieces`` (in order), once
    authenticated and verified; ``PartError`` otherwise. One piece is returned as it is."""
    if len(header) != HEADER_BYTES:
        reason = TRUNCATED if len(header) < HEADER_BYTES else CORRUPT
        raise PartError(reason, f"a header of {len(header)} bytes, expected {HEADER_BYTES}")
    head, mac = header[: _HEAD.size], header[_HEAD.size :]
    magic, version, _, start, end, length, digest = _HEAD.unpack(head)
    if magic != MAGIC:
        raise PartError(CORRUPT, "bad magic")
    if version != VERSION:
        raise PartError(MISMATCH, f"format version {version}, expected {VERSION}")
    if not hmac.compare_digest(dkey.mac(_mac_input(head, fingerprint, part_key)), mac):
        raise PartError(FORGED, "header authentication failed")
    if (start, end) != span or length != payload_len:
        raise PartError(MISMATCH, f"holds {[start, end]} of {length} bytes")
    got = sum(memoryview(p).nbytes for p in pieces)
    if got != length:
        raise PartError(TRUNCATED if got < length else CORRUPT, f"{got} bytes of {length}")
    if dkey.digest_pieces(pieces) != digest:
        raise PartError(CORRUPT, "checksum mismatch")
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _mac_input(head: bytes, fingerprint: str, part_key: str) -> bytes:
    fp, key = fingerprint.encode(), part_key.encode()
    return head + struct.pack("<II", len(fp), len(key)) + fp + key

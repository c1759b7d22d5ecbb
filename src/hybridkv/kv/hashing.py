"""Chained block hashes, identical in every process and on every machine.

Block k's hash covers (hash of block k-1, the token ids of block k, extra keys)::

    h_k = H( h_{k-1} | len(extra_k) (u32 LE) | extra_k | token ids of block k (u32 LE each) )

``h_{-1}`` is ``H(NONE_SEED)``; extra keys (a cache salt) are only given on block 0. The encoding
is fixed and no Python ``hash()`` is involved, so processes, tiers and peers agree on keys.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from enum import Enum
from typing import NewType

import xxhash

BlockHash = NewType("BlockHash", bytes)
HashFn = Callable[[bytes], bytes]

NONE_SEED = b"hybridkv/none-hash/v1"


class HashAlgo(str, Enum):
    SHA256 = "sha256"
    XXH3_128 = "xxh3_128"


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _xxh3_128(data: bytes) -> bytes:
    return xxhash.xxh3_128_digest(data, seed=0)


def get_hash_fn(algo: HashAlgo | str) -> HashFn:
    try:
        algo = HashAlgo(algo)
    except ValueError:
        names = [a.value for a in HashAlgo]
        raise ValueError(
            f"unknown prefix hash algorithm {algo!r}; expected one of {names}"
        ) from None
    return _sha256 if algo is HashAlgo.SHA256 else _xxh3_128


def encode_extra_keys(cache_salt: str | None) -> bytes:
    return b"" if cache_salt is None else b"salt\x00" + cache_salt.encode()


def hash_block(
    hash_fn: HashFn, parent: BlockHash | None, token_ids: Sequence[int], extra: bytes = b""
) -> BlockHash:
    head = parent if parent is not None else hash_fn(NONE_SEED)
    body = struct.pack(f"<I{len(token_ids)}I", len(extra), *token_ids)
    return BlockHash(hash_fn(head + body[:4] + extra + body[4:]))


class BlockHasher:
    """Extends a request's hash list as its tokens grow; only full blocks are hashed."""

    __slots__ = ("block_size", "hash_fn", "cache_salt", "extra")

    def __init__(self, block_size: int, hash_fn: HashFn, cache_salt: str | None = None) -> None:
        self.block_size = block_size
        self.hash_fn = hash_fn
        self.cache_salt = cache_salt
        self.extra = encode_extra_keys(cache_salt)

    def extend(self, hashes: list[BlockHash], token_ids: Sequence[int]) -> None:
        """Append the hashes of every newly completed block of ``token_ids`` to ``hashes``."""
        size = self.block_size
        first, stop = len(hashes), len(token_ids) // size
        if stop <= first:
            return
        # one pack for every new block: 4 bytes a token, block k at [4*size*(k-first), ...)
        body = struct.pack(f"<{(stop - first) * size}I", *token_ids[first * size : stop * size])
        hash_fn, width = self.hash_fn, 4 * size
        parent = hashes[-1] if hashes else hash_fn(NONE_SEED)
        at = 0
        if first == 0:
            extra = self.extra
            parent = BlockHash(
                hash_fn(parent + struct.pack("<I", len(extra)) + extra + body[:width])
            )
            hashes.append(parent)
            at = width
        no_extra = b"\0\0\0\0"  # len(extra) = 0 as u32 LE: extra keys are on block 0 only
        append = hashes.append
        for offset in range(at, len(body), width):
            parent = BlockHash(hash_fn(parent + no_extra + body[offset : offset + width]))
            append(parent)

"""Chained block hashes: fixed encoding, golden digests, identical across processes."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

from hybridkv.kv.hashing import NONE_SEED, BlockHash, BlockHasher, get_hash_fn, hash_block

TOKENS = list(range(1, 11))  # 10 tokens, block size 4 -> 2 full blocks (the last 2 unhashed)

GOLDEN = {
    ("sha256", None): [
        "27b0717e5921f2cac0f2d2ba78219df5e424ec660a77ddbc4e48a50d41b4f05e",
        "c77618a0571aa0e7be4115924a8a4ee464436c4e699aa2372e41beb40f11c247",
    ],
    ("sha256", "tenant-a"): [
        "64d9448039915e5336d1ed4be7fdd43327b7dcb77691560a34b79b338e19df20",
        "950af396bf97e4d4e0efd8f628328e2481f9e7c7104a1a9162f02823cad6b253",
    ],
    ("xxh3_128", None): [
        "1fc276b9c62e7c6df84c8a76972ad10a",
        "07a0677c40d634d0a0d173461e7de5b3",
    ],
    ("xxh3_128", "tenant-a"): [
        "bad28ff6349a2958edfc66d5352c24e3",
        "c800105f94572162eaf0f7dd02ff212a",
    ],
}


def _hex_hashes(algo: str, salt: str | None, tokens: list[int], block_size: int = 4) -> list[str]:
    out: list[BlockHash] = []
    BlockHasher(block_size, get_hash_fn(algo), salt).extend(out, tokens)
    return [h.hex() for h in out]


@pytest.mark.parametrize(("algo", "salt"), sorted(GOLDEN, key=str))
def test_golden_digests(algo: str, salt: str | None) -> None:
    assert _hex_hashes(algo, salt, TOKENS) == GOLDEN[(algo, salt)]


def test_encoding_matches_the_documented_format() -> None:
    """h_k = H(h_{k-1} | len(extra) u32 LE | extra | tokens u32 LE), h_{-1} = H(NONE_SEED)."""
    sha = lambda b: hashlib.sha256(b).digest()  # noqa: E731
    extra = b"salt\x00tenant-a"
    h0 = sha(
        sha(NONE_SEED) + struct.pack("<I", len(extra)) + extra + struct.pack("<4I", 1, 2, 3, 4)
    )
    h1 = sha(h0 + struct.pack("<I", 0) + struct.pack("<4I", 5, 6, 7, 8))
    assert [h0.hex(), h1.hex()] == GOLDEN[("sha256", "tenant-a")]
    x = lambda b: xxhash.xxh3_128_digest(b, seed=0)  # noqa: E731
    g0 = x(x(NONE_SEED) + struct.pack("<I", 0) + struct.pack("<4I", 1, 2, 3, 4))
    assert g0.hex() == GOLDEN[("xxh3_128", None)][0]


def test_chain_salt_and_incremental_extension() -> None:
    fn = get_hash_fn("sha256")
    hashes: list[BlockHash] = []
    hasher = BlockHasher(4, fn)
    hasher.extend(hashes, [1, 2, 3])
    assert hashes == []  # partial block: nothing hashed
    hasher.extend(hashes, [1, 2, 3, 4, 5, 6, 7])
    assert len(hashes) == 1
    hasher.extend(hashes, TOKENS)
    assert [h.hex() for h in hashes] == GOLDEN[("sha256", None)]
    # the chain: same block-1 tokens after a different block 0 hash differently
    other = _hex_hashes("sha256", None, [9, 9, 9, 9, 5, 6, 7, 8])
    assert other[1] != GOLDEN[("sha256", None)][1]
    # the salt only enters block 0, yet changes every later hash through the chain
    assert hash_block(fn, None, [1, 2, 3, 4], b"") != hash_block(fn, None, [1, 2, 3, 4], b"x")
    # large token ids are fine (u32)
    assert len(_hex_hashes("xxh3_128", None, [2**32 - 1] * 4)) == 1


def test_unknown_algorithm_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown prefix hash algorithm"):
        get_hash_fn("md5")


_CHILD = """
import json, sys
from hybridkv.kv.hashing import BlockHasher, get_hash_fn
from tests.kv.builders import make_layout
out = {}
for algo in ("sha256", "xxh3_128"):
    for salt in (None, "tenant-a"):
        hs = []
        BlockHasher(4, get_hash_fn(algo), salt).extend(hs, list(range(1, 11)))
        out[f"{algo}/{salt}"] = [h.hex() for h in hs]
out["fingerprint"] = make_layout("qwen35").fingerprint("m")
print(json.dumps(out))
"""


@pytest.mark.parametrize("seed", ["0", "12345"])
def test_hashes_equal_in_another_process(seed: str) -> None:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=f"{root}{os.pathsep}{root / 'src'}")
    res = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        check=True,
    )
    child = json.loads(res.stdout)
    for (algo, salt), golden in GOLDEN.items():
        assert child[f"{algo}/{salt}"] == golden
        assert _hex_hashes(algo, salt, TOKENS) == golden
    assert child["fingerprint"] == "7d0e1d9365583bfd9e7faa728c94e0b6"

"""GGUF's block-quantized weight formats in numpy: their layouts, a packer and a dequantizer.

A quantized ``[N, K]`` weight is ``[N, K / block_values * block_bytes]`` uint8: each row is
its own run of blocks, so rows can be sliced or concatenated as bytes (a fused q|k|v weight
is its parts' rows one after another). fp16 scales are little-endian.

- **Q8_0** (32 values, 34 bytes): ``d`` fp16, then 32 int8 ``q``; ``w = d * q``.
- **Q4_K** (256 values, 144 bytes): ``d`` fp16, ``dmin`` fp16, 12 bytes holding a 6-bit scale
  ``sc[s]`` and 6-bit min ``m[s]`` for each of 8 sub-blocks of 32, then 128 bytes of nibbles;
  ``w = (d * sc[s]) * q - dmin * m[s]``. Scale bytes: for ``t < 4`` byte ``t`` holds ``sc[t]``
  in its low 6 bits, byte ``4 + t`` holds ``m[t]``; the top 2 bits of bytes ``t`` / ``4 + t``
  and the two nibbles of byte ``8 + t`` hold ``sc[4 + t]`` / ``m[4 + t]`` (low nibble of byte
  ``8 + t`` = low 4 bits of ``sc[4 + t]``, high nibble = those of ``m[4 + t]``). Nibbles: byte
  ``32 j + l`` holds value ``l`` of sub-block ``2j`` (low nibble) and of ``2j + 1`` (high).
- **Q6_K** (256 values, 210 bytes): 128 bytes ``ql`` (low 4 bits), 64 bytes ``qh`` (high 2
  bits), 16 int8 scales (one per 16 values), ``d`` fp16; ``w = (d * sc) * (q - 32)``. In half
  ``h`` (values ``128 h ..``) value ``v``'s low bits are nibble ``v // 64`` of
  ``ql[64 h + v % 64]``, its high bits are bits ``2 (v // 32)`` of ``qh[32 h + v % 32]``.

The packer (Q8_0 rounds as GGUF's reference does, half away from zero; Q4_K picks each
sub-block's scale and min from its range, Q6_K each sub-block's scale from its largest
magnitude) is tested against the ``gguf`` package's helpers; the
dequantizer is the native kernels' reference (``hybridkv.native.quant``) and their fallback.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class BlockLayout:
    ggml_type: int  # the GGUF tensor type number
    block_values: int
    block_bytes: int


class QuantFormat(enum.Enum):
    Q8_0 = BlockLayout(8, 32, 34)
    Q4_K = BlockLayout(12, 256, 144)
    Q6_K = BlockLayout(14, 256, 210)

    def __init__(self, layout: BlockLayout) -> None:
        # plain attributes: ``self.value`` goes through enum's descriptor (~1 us), and a decode
        # step asks for the layout of every projection
        self.layout = layout
        self._sizes = (layout.block_values, layout.block_bytes)

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of ``k`` values (``k`` a multiple of the block); else ValueError."""
        values, nbytes = self._sizes
        if k <= 0 or k % values:
            raise ValueError(f"{self.name} rows need a multiple of {values}")
        return k // values * nbytes

    @classmethod
    def of_ggml_type(cls, ggml_type: int) -> QuantFormat | None:
        return next((f for f in cls if f.layout.ggml_type == ggml_type), None)


def _round_away(x: Array) -> Array:
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _half_bytes(x: Array) -> Array:
    """``[n]`` float32 -> ``[n, 2]`` uint8: its fp16 bytes."""
    return np.ascontiguousarray(x.astype(np.float16)).view(np.uint8).reshape(-1, 2)


def _halves(raw: Array) -> Array:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32).reshape(-1)


def _blocks(weight: Array, fmt: QuantFormat) -> Array:
    if weight.ndim != 2:
        raise ValueError(f"a weight to pack is [N, K], got shape {weight.shape}")
    fmt.row_bytes(weight.shape[1])  # checks K
    return np.asarray(weight, dtype=np.float32).reshape(-1, fmt.layout.block_values)


def pack(weight: Array, fmt: QuantFormat) -> Array:
    """float32 ``[N, K]`` -> ``[N, row_bytes]`` uint8 in ``fmt``."""
    blocks = _blocks(weight, fmt)
    if fmt is QuantFormat.Q8_0:
        packed = _pack_q8_0(blocks)
    elif fmt is QuantFormat.Q4_K:
        packed = _pack_q4_k(blocks)
    else:
        packed = _pack_q6_k(blocks)
    return packed.reshape(weight.shape[0], fmt.row_bytes(weight.shape[1]))


def _pack_q8_0(blocks: Array) -> Array:
    d = np.abs(blocks).max(axis=1) / 127  # [n]
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, 0, 1 / d)
    q = _round_away(blocks * inv[:, None]).astype(np.int8)  # [n, 32]
    return np.concatenate([_half_bytes(d), q.view(np.uint8)], axis=1)


def _pack_q4_k(blocks: Array) -> Array:
    sub = blocks.reshape(-1, 8, 32)
    lo, hi = np.minimum(sub.min(axis=2), 0), np.maximum(sub.max(axis=2), 0)  # [n, 8]
    d_raw = _half_bytes((hi - lo).max(axis=1) / 15 / 63)  # the largest scale is 63 * d
    dmin_raw = _half_bytes((-lo).max(axis=1) / 63)
    d, dmin = _halves(d_raw)[:, None], _halves(dmin_raw)[:, None]  # [n, 1], as stored
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.clip(_round_away((hi - lo) / 15 / d), 0, 63), 0)
        mn = np.where(dmin > 0, np.clip(np.ceil(-lo / dmin), 0, 63), 0)
        ds, dm = (d * sc).astype(np.float32), (dmin * mn).astype(np.float32)  # [n, 8]
        q = np.where(ds[..., None] > 0, _round_away((sub + dm[..., None]) / ds[..., None]), 0)
    q = np.clip(q, 0, 15).astype(np.uint8)  # [n, 8, 32]
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    scales = np.empty((len(blocks), 12), dtype=np.uint8)
    scales[:, 0:4] = (sc[:, :4] & 63) | (sc[:, 4:] >> 4) << 6
    scales[:, 4:8] = (mn[:, :4] & 63) | (mn[:, 4:] >> 4) << 6
    scales[:, 8:12] = (sc[:, 4:] & 15) | (mn[:, 4:] & 15) << 4
    nibbles = (q[:, 0::2] | q[:, 1::2] << 4).reshape(-1, 128)  # [n, 4 * 32]
    return np.concatenate([d_raw, dmin_raw, scales, nibbles], axis=1)


def _pack_q6_k(blocks: Array) -> Array:
    sub = blocks.reshape(-1, 16, 16)
    scale = np.abs(sub).max(axis=2) / 31  # [n, 16]: q - 32 in [-31, 31]
    d_raw = _half_bytes(scale.max(axis=1) / 127)
    d = _halves(d_raw)[:, None]  # [n, 1], as stored
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.clip(_round_away(scale / d), 0, 127), 0)
        ds = (d * sc).astype(np.float32)  # [n, 16]
        q = np.where(ds[..., None] > 0, _round_away(sub / ds[..., None]), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # [n, half, 4, 32]
    ql = (q[:, :, 0:2] & 15) | (q[:, :, 2:4] & 15) << 4  # [n, 2, 2, 32]: byte 64 h + v % 64
    qh = (q >> 4) << np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    qh = np.bitwise_or.reduce(qh, axis=2)  # [n, 2, 32]: byte 32 h + v % 32
    scales = sc.astype(np.int8).view(np.uint8)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), scales, d_raw], axis=1)


def dequantize(data: Array, fmt: QuantFormat, k: int) -> Array:
    """``[N, row_bytes]`` uint8 in ``fmt`` -> float32 ``[N, k]``."""
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != fmt.row_bytes(k):
        raise ValueError(f"{fmt.name} data of {k} columns is uint8 [N, {fmt.row_bytes(k)}]")
    blocks = np.ascontiguousarray(data).reshape(-1, fmt.layout.block_bytes)
    if fmt is QuantFormat.Q8_0:
        values = _halves(blocks[:, :2])[:, None] * blocks[:, 2:].view(np.int8)
    elif fmt is QuantFormat.Q4_K:
        values = _dequantize_q4_k(blocks)
    else:
        values = _dequantize_q6_k(blocks)
    return values.astype(np.float32).reshape(data.shape[0], k)


def _dequantize_q4_k(blocks: Array) -> Array:
    d, dmin = _halves(blocks[:, 0:2])[:, None], _halves(blocks[:, 2:4])[:, None]
    s = blocks[:, 4:16].astype(np.int32)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | (s[:, 0:4] >> 6) << 4], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | (s[:, 4:8] >> 6) << 4], axis=1)
    nib = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (nib & 15).reshape(-1, 8, 32).astype(np.float32)
    ds, dm = (d * sc).astype(np.float32), (dmin * mn).astype(np.float32)  # [n, 8]
    values: Array = ds[..., None] * q - dm[..., None]
    return values.reshape(-1, 256)


def _dequantize_q6_k(blocks: Array) -> Array:
    ql, qh = blocks[:, :128].reshape(-1, 2, 1, 64), blocks[:, 128:192].reshape(-1, 2, 1, 32)
    low = (ql >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 15  # [n, 2, 2, 64]
    high = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3  # [n, 2, 4, 32]
    q = (low.reshape(-1, 2, 128) | high.reshape(-1, 2, 128) << 4).astype(np.float32) - 32
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)  # [n, 16]
    ds = (_halves(blocks[:, 208:210])[:, None] * sc).astype(np.float32)
    return (ds.reshape(-1, 16, 1) * q.reshape(-1, 16, 16)).reshape(-1, 256)


def activation_block(fmt: QuantFormat) -> int:
    """Values per int8 block of activations multiplied by ``fmt`` weights (as llama.cpp's
    Q8_0 / Q8_K): 32 for Q8_0, 256 for the K-quants."""
    return 32 if fmt is QuantFormat.Q8_0 else 256


def quantize_activations(x: Array, fmt: QuantFormat) -> Array:
    """float32 ``[M, K]`` -> the values the int8-activation kernel multiplies (``[M, K]``
    float32 ``dx * xq``): per block, ``dx = max|x| / 127`` and ``xq = rint(x * (127 /
    max|x|))`` (ties to even), all in float32; a block with NaN / inf becomes NaN."""
    qb = activation_block(fmt)
    blocks = np.asarray(x, dtype=np.float32).reshape(-1, qb)
    amax = np.abs(blocks).max(axis=1)  # [n]
    finite: Array = np.asarray(np.isfinite(blocks).all(axis=1))  # [n]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ok = finite & (amax >= np.float32(1e-30))
        inv = np.where(ok, np.float32(127) / np.where(ok, amax, 1), 0).astype(np.float32)
        q = np.rint(np.where(finite[:, None], blocks, 0) * inv[:, None])
        dx = np.where(finite, amax / np.float32(127), np.nan).astype(np.float32)
    values: Array = (q.astype(np.float32) * dx[:, None]).astype(np.float32)
    return values.reshape(np.shape(x))

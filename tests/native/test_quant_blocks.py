"""The project's packer and dequantizer (``native/quant_blocks.py``) against the ``gguf``
package's: Q8_0 packs bit for bit as GGUF's reference does; Q4_K blocks (gguf has no Q4_K
packer) dequantize to the same values under gguf's reader, within the format's rounding of
the original weights; Q6_K (random and packed blocks) dequantizes as gguf does; rows
concatenate as bytes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import quants

from hybridkv.native.quant_blocks import QuantFormat, dequantize, pack


def _weights(n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    w[0, :256] = 0.0  # an all-zero block
    w[1, :256] = np.abs(w[1, :256]) + 0.01  # a block with no negative value
    w[2, 256:512] *= 40  # a block far larger than the rest of its row
    return w


def _ggml(fmt: QuantFormat) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType(fmt.layout.ggml_type)


def test_q8_0_packs_as_gguf() -> None:
    w = _weights(6, 768)
    assert np.array_equal(pack(w, QuantFormat.Q8_0), quants.quantize(w, _ggml(QuantFormat.Q8_0)))


@pytest.mark.parametrize("fmt", [QuantFormat.Q8_0, QuantFormat.Q4_K], ids=["Q8_0", "Q4_K"])
def test_packed_blocks_read_back_by_gguf(fmt: QuantFormat) -> None:
    w = _weights(6, 768)
    packed = pack(w, fmt)
    assert packed.shape == (6, fmt.row_bytes(768)) and packed.dtype == np.uint8
    theirs = quants.dequantize(packed, _ggml(fmt))
    ours = dequantize(packed, fmt, 768)
    assert np.array_equal(ours, theirs)
    # the rounding each format allows, per block of 32: Q8_0 half a step (max|w| / 127) plus
    # the fp16 scale's rounding (127 steps x 2^-11); Q4_K half a step of the block's range
    # (with 0) / 15, plus the 6-bit scale's and min's rounding (a quarter step at most here)
    sub = w.reshape(-1, 32)
    if fmt is QuantFormat.Q8_0:
        step, allowed = np.abs(sub).max(1) / 127, 0.5 + 127 * 2.0**-11
    else:
        step, allowed = (np.maximum(sub.max(1), 0) - np.minimum(sub.min(1), 0)) / 15, 0.75
    err = np.abs(ours - w).reshape(-1, 32).max(1)
    assert (err <= step * allowed + 1e-7).all()
    assert np.all(ours.reshape(6, 3, 256)[0, 0] == 0)  # zeros stay exact


def test_q6_k_dequantizes_as_gguf() -> None:
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (8, 210), dtype=np.uint8)
    blocks[:, 208:210] = np.array([0.003], np.float16).view(np.uint8)
    data = blocks.reshape(2, 4 * 210)
    theirs = quants.dequantize(data, _ggml(QuantFormat.Q6_K))
    assert np.array_equal(dequantize(data, QuantFormat.Q6_K, 1024), theirs)
    w = _weights(4, 512)
    packed = pack(w, QuantFormat.Q6_K)  # gguf has no Q6_K packer: it reads ours back
    ours = dequantize(packed, QuantFormat.Q6_K, 512)
    assert np.array_equal(quants.dequantize(packed, _ggml(QuantFormat.Q6_K)), ours)
    # half a step (max|w| / 31 per 16 values) plus the 8-bit scale's rounding
    sub = w.reshape(-1, 16)
    err = np.abs(ours - w).reshape(-1, 16).max(1)
    assert (err <= np.abs(sub).max(1) / 31 * 0.75 + 1e-7).all()


def test_rows_concatenate_as_bytes() -> None:
    a, b = _weights(3, 512, seed=2), _weights(5, 512, seed=3)
    fmt = QuantFormat.Q4_K
    joined = np.concatenate([pack(a, fmt), pack(b, fmt)])
    assert np.array_equal(dequantize(joined, fmt, 512), np.concatenate(
        [dequantize(pack(a, fmt), fmt, 512), dequantize(pack(b, fmt), fmt, 512)]
    ))  # fmt: skip


def test_bad_shapes_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 256"):
        pack(np.zeros((2, 300), np.float32), QuantFormat.Q4_K)
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantFormat.Q8_0.row_bytes(0)
    with pytest.raises(ValueError, match="uint8"):
        dequantize(np.zeros((2, 34), np.uint8), QuantFormat.Q8_0, 64)
    assert QuantFormat.of_ggml_type(12) is QuantFormat.Q4_K and QuantFormat.of_ggml_type(0) is None

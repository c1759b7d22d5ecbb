"""Q8_0 weights by int8 activations (``native/quant_q8_0.h``): every instruction-set variant this
CPU runs (``isa`` fixture) gives the bits of the scalar build, the reference (8 lane sums of
4 values per block, one fused multiply-add each, a fixed tree at the end); the quantized
activations themselves (``quantize_rows``, vectorized on AVX2) match numpy's; bitwise the same
for a row alone, in any batch, after a bias, on 1 or 2 threads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridkv.native import quant
from hybridkv.native.isa import VARIANTS, missing_flags
from hybridkv.native.quant import QuantGemm
from hybridkv.native.quant_blocks import QuantFormat, dequantize, pack, quantize_activations
from tests.native.no_compiler import built_or_skip

Q8 = QuantFormat.Q8_0


@pytest.fixture(scope="module")
def kernel(isa: str) -> QuantGemm:
    return built_or_skip(quant.load_quant(isa))


@pytest.fixture(scope="module")
def scalar() -> QuantGemm:
    """The scalar build, the reference (every x86-64 CPU runs it)."""
    if missing_flags(VARIANTS["scalar"]):
        pytest.skip("not an x86-64 CPU")
    return built_or_skip(quant.load_quant("scalar"))


def hostile_rows(m: int, k: int, seed: int) -> torch.Tensor:
    """``[m, k]`` float32 rows with outliers, a zero block, tiny values and a block holding
    ±inf / NaN (its outputs NaN on every variant)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, 5] *= 300.0  # one outlier: the rest of its block rounds to few levels
    x[:, 32:64] = 0.0
    if m > 1:
        x[1, 64:96] *= 1e-32  # below the 1e-30 floor: quantized to zeros
    if m > 2:
        x[2, 100] = np.inf
    if m > 3:
        x[3, 200] = np.nan
    return torch.from_numpy(x)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9, 48])
def test_every_variant_gives_the_scalar_bits(kernel: QuantGemm, scalar: QuantGemm, m: int) -> None:
    k, n = 1024, 37  # weight rows off any pass width
    rng = np.random.default_rng(m)
    data = torch.from_numpy(pack(rng.standard_normal((n, k)).astype(np.float32) * 0.05, Q8))
    x = hostile_rows(m, k, m)
    bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    got = kernel.linear(x, data, Q8, bias, int8_activations=True)
    want = scalar.linear(x, data, Q8, bias, int8_activations=True)
    assert same_bits(got, want)
    finite = [r for r in range(m) if r not in (2, 3)]
    assert torch.isnan(got[[r for r in (2, 3) if r < m]]).all()
    # the sums themselves: the numpy-quantized activations times the dequantized weight
    xq = torch.from_numpy(quantize_activations(x[finite].numpy(), Q8)).double()
    w = torch.from_numpy(dequantize(data.numpy(), Q8, k)).double()
    ref = xq @ w.T + bias.double()
    bound = 2e-6 * (xq.abs() @ w.abs().T) + 1e-6
    assert ((got[finite].double() - ref).abs() <= bound).all()


def test_integer_extremes_do_not_saturate(kernel: QuantGemm, scalar: QuantGemm) -> None:
    """q = -128 (|q| = 128 as an unsigned byte) against xq = ±127: the largest pair sums."""
    k = 256
    blocks = np.zeros((k // 32, 34), np.uint8)
    blocks[:, :2] = np.array([1.0], np.float16).view(np.uint8)
    blocks[:, 2:] = np.uint8(128)  # int8 -128
    data = torch.from_numpy(blocks.reshape(1, -1))
    x = torch.full((2, k), -1.0)
    x[1, ::2] = 1.0  # xq = ±127, dx = 1 / 127
    got = kernel.linear(x, data, Q8, int8_activations=True)
    assert same_bits(got, scalar.linear(x, data, Q8, int8_activations=True))
    assert got[0, 0].item() == pytest.approx(128.0 * k, rel=1e-6)
    assert got[1, 0].item() == pytest.approx(0.0, abs=1e-3)


def test_row_alone_equals_row_in_a_batch(kernel: QuantGemm) -> None:
    k, n = 2048, 300
    data = torch.from_numpy(
        pack(np.random.default_rng(7).standard_normal((n, k)).astype(np.float32) * 0.05, Q8)
    )
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(3))
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        batch = kernel.linear(x, data, Q8, int8_activations=True)
        torch.set_num_threads(1)
        for r in range(x.shape[0]):
            alone = kernel.linear(x[r : r + 1], data, Q8, int8_activations=True)
            assert same_bits(alone[0], batch[r])
    finally:
        torch.set_num_threads(saved)

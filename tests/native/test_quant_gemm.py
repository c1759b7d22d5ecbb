"""The block-quantized GEMM (``native/quant.c``) on every instruction-set variant this CPU runs
(``isa`` fixture): against a float64 product with the numpy-dequantized weight (the reference),
for Q8_0, Q4_K and Q6_K, row counts off the register tile, weight rows off the panel, biases,
strided inputs; its dequantizer against numpy's; bitwise the same for a row alone or in any
batch, on 1 or 2 threads; bad inputs refused; without a compiler the loader returns None.
The int8-activation path (``quant_int8.h``) the same way, its reference the numpy-quantized
activations (``quantize_activations``) times the dequantized weight."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hybridkv.native import quant
from hybridkv.native.isa import cpu_flags
from hybridkv.native.quant import QuantGemm
from hybridkv.native.quant_blocks import QuantFormat, dequantize, pack, quantize_activations
from tests.native.no_compiler import assert_unavailable_without_compiler, built_or_skip
from tests.native.test_batch_invariance import threads  # noqa: F401 (a fixture)

RTOL = 2e-6  # of sum |x_k w_k|: float32 summation in another order (K <= 1024)
FORMATS = list(QuantFormat)


@pytest.fixture(scope="module")
def kernel(isa: str) -> QuantGemm:
    return built_or_skip(quant.load_quant(isa))


def random_packed(fmt: QuantFormat, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """``[n, row_bytes]`` of ``fmt``: random weights packed (Q6_K: random blocks, sane scales)."""
    rng = np.random.default_rng(seed)
    if fmt is not QuantFormat.Q6_K:
        return torch.from_numpy(pack(rng.standard_normal((n, k)).astype(np.float32) * 0.1, fmt))
    blocks = rng.integers(0, 256, (n * k // 256, 210), dtype=np.uint8)
    blocks[:, 208:210] = np.array([0.002], np.float16).view(np.uint8)
    return torch.from_numpy(blocks.reshape(n, fmt.row_bytes(k)))


def reference(x: torch.Tensor, data: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    w = torch.from_numpy(dequantize(data.numpy(), fmt, x.shape[-1])).double()
    return x.double() @ w.T


def int8_values(x: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """The activations the int8 path multiplies (``dx * xq`` per block), float32."""
    return torch.from_numpy(quantize_activations(x.contiguous().numpy(), fmt))


def assert_close(got: torch.Tensor, x: torch.Tensor, data: torch.Tensor, fmt: QuantFormat) -> None:
    ref = reference(x, data, fmt)
    w = torch.from_numpy(dequantize(data.numpy(), fmt, x.shape[-1])).double()
    bound = RTOL * (x.double().abs() @ w.abs().T) + 1e-30
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert ((got.double() - ref).abs() <= bound).all()


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 17])
@pytest.mark.parametrize(("n", "k"), [(1, 256), (7, 512), (130, 768)])
def test_matches_dequantized_reference(
    kernel: QuantGemm, fmt: QuantFormat, m: int, n: int, k: int
) -> None:
    data = random_packed(fmt, n, k, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    assert_close(kernel.linear(x, data, fmt), x, data, fmt)


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 9, 40])
@pytest.mark.parametrize(("n", "k"), [(1, 256), (7, 512), (130, 768)])
def test_int8_path_matches_quantized_reference(
    kernel: QuantGemm, fmt: QuantFormat, m: int, n: int, k: int
) -> None:
    data = random_packed(fmt, n, k, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 3
    x[0, :32] *= 100  # one block far larger than the rest: its own scale
    got = kernel.linear(x, data, fmt, int8_activations=True)
    assert_close(got, int8_values(x, fmt), data, fmt)
    # and the int8 rounding stays small against float32 activations (rows without outliers)
    ref = reference(x[1:], data, fmt)
    w = torch.from_numpy(dequantize(data.numpy(), fmt, k)).double()
    assert ((got[1:].double() - ref).abs() <= 0.01 * (x[1:].double().abs() @ w.abs().T)).all()


def integer_blocks(fmt: QuantFormat, n: int, k: int, seed: int) -> torch.Tensor:
    """``[n, row_bytes]`` of random blocks whose fp16 scales (d, dmin) are 1.0: every weight
    an integer."""
    rng = np.random.default_rng(seed)
    size = fmt.layout.block_bytes
    blocks = rng.integers(0, 256, (n * k // fmt.layout.block_values, size), dtype=np.uint8)
    one = np.array([1.0], np.float16).view(np.uint8)
    for offset in {QuantFormat.Q8_0: [0], QuantFormat.Q4_K: [0, 2], QuantFormat.Q6_K: [208]}[fmt]:
        blocks[:, offset : offset + 2] = one
    return torch.from_numpy(blocks.reshape(n, fmt.row_bytes(k)))


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
@pytest.mark.parametrize("m", [1, 2, 3, 6, 16, 19])
def test_int8_path_integers_are_exact_on_every_variant(
    kernel: QuantGemm, fmt: QuantFormat, m: int
) -> None:
    """Integer weights, and x rows whose every block holds one +-127 (so dx = 1 and xq = x)
    and small integers: every partial sum is an integer below 2^24, so the float result is
    the exact integer product whatever the ISA variant's lanes and order -- each variant's
    integer dot products (VNNI, AVX2, scalar) are checked against the same exact answer."""
    n, k = 7, 512
    data = integer_blocks(fmt, n, k, seed=m)
    rng = np.random.default_rng(10 + m)
    x = rng.integers(-4, 5, (m, k)).astype(np.float32)
    qb = 32 if fmt is QuantFormat.Q8_0 else 256
    x[:, rng.integers(0, qb) :: qb] = 127.0 * rng.choice([-1.0, 1.0], (m, k // qb))
    w = dequantize(data.numpy(), fmt, k).astype(np.int64)
    assert (w == dequantize(data.numpy(), fmt, k)).all()  # integers indeed
    expected = torch.from_numpy((x.astype(np.int64) @ w.T).astype(np.float32))
    assert expected.abs().max() < 2**24
    got = kernel.linear(torch.from_numpy(x), data, fmt, int8_activations=True)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_int8_path_bias_strides_and_hostile_rows(kernel: QuantGemm, fmt: QuantFormat) -> None:
    data = random_packed(fmt, 33, 512, seed=4)
    fused = torch.randn(6, 3 * 512, generator=torch.Generator().manual_seed(4))
    x = fused[:, 512:1024]  # a view: row stride 1536
    x[1, 7], x[2, 300], x[3, :] = float("nan"), float("inf"), 0.0
    x[4, :] = 1e30  # huge, and the product still finite
    bias = torch.randn(33)
    got = kernel.linear(x, data, fmt, bias, int8_activations=True)
    assert got[1:3].isnan().all() and got[[0, 3, 4, 5]].isfinite().all()  # only its own row
    assert torch.equal(got[3], bias)  # zero activations: the bias alone
    rows = [0, 5]
    assert_close(got[rows] - bias, int8_values(x[rows], fmt), data, fmt)
    alone = kernel.linear(x[5:6], data, fmt, bias, int8_activations=True)
    assert torch.equal(alone, got[5:6])


@pytest.mark.usefixtures("threads")  # 1, then 2 threads
@pytest.mark.parametrize("fmt", [QuantFormat.Q4_K, QuantFormat.Q6_K], ids=["Q4_K", "Q6_K"])
def test_tiled_int8_is_bitwise_the_per_row_kernel(
    kernel: QuantGemm, fmt: QuantFormat, isa: str
) -> None:
    """From ``I8_TILE_ROWS`` (4) rows the K-quants take the tiled kernel (``quant_tiled.h``;
    AVX2 builds): bitwise the per-row kernel's result for each row -- the same rows in calls of
    at most 3 rows take the per-row kernel. K = 4096: the x rows come in chunks of 48 (a second,
    short chunk at 50 rows); 9 weight rows: a short panel; a bias; a strided view."""
    avx2_only = isa == "avx2" or (isa == "native" and "avx512bw" not in cpu_flags())
    assert kernel.tile_rows == (4 if avx2_only else 0)
    k, n = 4096, 9
    data = random_packed(fmt, n, k, seed=7)
    fused = torch.randn(50, 2 * k, generator=torch.Generator().manual_seed(8))
    x, bias = fused[:, k:], torch.randn(n, generator=torch.Generator().manual_seed(9))
    tiled = kernel.linear(x, data, fmt, bias, int8_activations=True)
    per_row = torch.cat(
        [kernel.linear(x[r : r + 3], data, fmt, bias, True) for r in range(0, 50, 3)]
    )
    assert torch.equal(tiled, per_row)
    assert_close(tiled - bias, int8_values(x, fmt), data, fmt)


def test_q8_0_short_rows_bias_and_strides(kernel: QuantGemm) -> None:
    fmt = QuantFormat.Q8_0
    data = random_packed(fmt, 33, 96)
    fused = torch.randn(9, 3 * 96)
    x = fused[:, 96:192]  # a view of a fused projection: row stride 288
    bias = torch.randn(33)
    got = kernel.linear(x, data, fmt, bias)
    assert_close(got - bias, x, data, fmt)
    three_d = kernel.linear(x.reshape(3, 3, 96), data, fmt, bias)
    assert torch.equal(three_d.reshape(9, 33), got)
    assert kernel.linear(torch.zeros(0, 96), data, fmt).shape == (0, 33)


@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_dequantize_matches_numpy(kernel: QuantGemm, fmt: QuantFormat) -> None:
    data = random_packed(fmt, 9, 512, seed=3)
    got, ref = (
        kernel.dequantize(data, fmt, 512),
        torch.from_numpy(dequantize(data.numpy(), fmt, 512)),
    )
    if fmt is QuantFormat.Q4_K:  # the kernel's d*sc*q - dmin*m may be one fused rounding
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6 * ref.abs().max().item())
    else:
        assert torch.equal(got, ref)


@pytest.mark.usefixtures("threads")  # 1, then 2 threads
@pytest.mark.parametrize("int8", [False, True], ids=["f32", "int8"])
@pytest.mark.parametrize("fmt", FORMATS, ids=[f.name for f in FORMATS])
def test_batch_invariance(kernel: QuantGemm, fmt: QuantFormat, int8: bool) -> None:
    data = random_packed(fmt, 514, 1024, seed=5)  # 514 x 1024: the OpenMP branch, a short panel
    x = torch.randn(21, 1024, generator=torch.Generator().manual_seed(6))  # int8: tiled
    batch = kernel.linear(x, data, fmt, int8_activations=int8)
    for r in (0, 5, 20):
        alone = kernel.linear(x[r : r + 1], data, fmt, int8_activations=int8)
        assert torch.equal(alone, batch[r : r + 1])
    torch.set_num_threads(3 - torch.get_num_threads())  # and the other count
    assert torch.equal(kernel.linear(x, data, fmt, int8_activations=int8), batch)


def test_bad_inputs_refused(kernel: QuantGemm) -> None:
    fmt, data = QuantFormat.Q4_K, random_packed(QuantFormat.Q4_K, 4, 256)
    with pytest.raises(ValueError, match="float32"):
        kernel.linear(torch.zeros(1, 256, dtype=torch.float64), data, fmt)
    with pytest.raises(ValueError, match="multiple of 256"):
        kernel.linear(torch.zeros(1, 128), data, fmt)
    with pytest.raises(ValueError, match="bytes a row"):
        kernel.linear(torch.zeros(1, 512), data, fmt)
    with pytest.raises(ValueError, match="uint8"):
        kernel.linear(torch.zeros(1, 256), data.view(torch.int8), fmt)
    with pytest.raises(ValueError, match="contiguous"):
        kernel.linear(torch.zeros(1, 256), torch.cat([data, data], 1)[:, :144], fmt)
    with pytest.raises(ValueError, match="bias"):
        kernel.linear(torch.zeros(1, 256), data, fmt, torch.zeros(5))


def test_unavailable_without_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert_unavailable_without_compiler(
        quant.load_quant.__wrapped__,
        "native quantized GEMM unavailable",
        tmp_path,
        monkeypatch,
        caplog,
    )

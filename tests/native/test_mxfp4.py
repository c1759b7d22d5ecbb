"""The MXFP4 GEMM (``native/mxfp4.c``) on every instruction-set variant this CPU runs (``isa``
fixture): its dequantizer bit for bit against the torch reference (every code, every scale
from subnormal to the largest allowed); the product against a float64 one with the reference
weights, row counts off the register tile, weight rows off the panel, biases, strided inputs;
bitwise the same for a row alone or in any batch, on 1 or 2 threads; the packer's round trip;
bad inputs refused; without a compiler the loader returns None."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridkv.native import mxfp4
from hybridkv.native.mxfp4 import MAX_SCALE, Mxfp4Gemm, check_scales, dequantize_reference
from tests.native.no_compiler import assert_unavailable_without_compiler, built_or_skip
from tests.native.test_batch_invariance import threads  # noqa: F401 (a fixture)
from tests.support.hub_pack import pack_mxfp4, unit_of

RTOL = 2e-6  # of sum |x_k w_k|: float32 summation in another order


@pytest.fixture(scope="module")
def kernel(isa: str) -> Mxfp4Gemm:
    return built_or_skip(mxfp4.load_mxfp4(isa))


def random_mxfp4(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    return pack_mxfp4(w)


def assert_close(got: torch.Tensor, x: torch.Tensor, blocks: torch.Tensor, scales: torch.Tensor):
    w = dequantize_reference(blocks, scales).double()
    ref = x.double() @ w.T
    bound = RTOL * (x.double().abs() @ w.abs().T) + 1e-30
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert ((got.double() - ref).abs() <= bound).all()


def test_dequantize_every_code_and_scale(kernel: Mxfp4Gemm) -> None:
    n = MAX_SCALE + 1  # row r: scale r (2^-127 .. 2^125), bytes (16 r + i) % 256: every byte
    raw = (torch.arange(n)[:, None] * 16 + torch.arange(16)) % 256
    blocks, scales = raw.to(torch.uint8).view(n, 1, 16), torch.arange(n, dtype=torch.uint8)[:, None]
    got, ref = kernel.dequantize(blocks, scales), dequantize_reference(blocks, scales)
    assert torch.equal(got, ref) and torch.isfinite(got).all()
    for r in (0, 1, 127, 200, MAX_SCALE):  # by hand: value 2i low nibble, 2i + 1 high
        unit = 2.0 ** (r - 127)
        by_hand = [mxfp4.E2M1[(int(b) >> s) & 15] * unit for b in raw[r] for s in (0, 4)]
        assert ref[r].tolist() == by_hand


@pytest.mark.parametrize("m", [1, 2, 3, 5, 17])
@pytest.mark.parametrize(("n", "k"), [(1, 32), (7, 96), (130, 512)])
def test_matches_dequantized_reference(kernel: Mxfp4Gemm, m: int, n: int, k: int) -> None:
    blocks, scales = random_mxfp4(n, k, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    assert_close(kernel.linear(x, blocks, scales), x, blocks, scales)


def test_bias_strides_and_empty(kernel: Mxfp4Gemm) -> None:
    blocks, scales = random_mxfp4(33, 64)
    fused = torch.randn(9, 3 * 64)
    x = fused[:, 64:128]  # a view: row stride 192
    bias = torch.randn(33)
    got = kernel.linear(x, blocks, scales, bias)
    assert_close(got - bias, x, blocks, scales)
    three_d = kernel.linear(x.reshape(3, 3, 64), blocks, scales, bias)
    assert torch.equal(three_d.reshape(9, 33), got)
    assert kernel.linear(torch.zeros(0, 64), blocks, scales).shape == (0, 33)


@pytest.mark.usefixtures("threads")  # 1, then 2 threads
def test_batch_invariance(kernel: Mxfp4Gemm) -> None:
    blocks, scales = random_mxfp4(514, 1024, seed=5)  # the OpenMP branch, a short panel
    x = torch.randn(13, 1024, generator=torch.Generator().manual_seed(6))
    batch = kernel.linear(x, blocks, scales)
    for r in (0, 5, 12):
        assert torch.equal(kernel.linear(x[r : r + 1], blocks, scales), batch[r : r + 1])
    assert torch.equal(kernel.linear(x[:2], blocks, scales), batch[:2])  # the fused tile
    torch.set_num_threads(3 - torch.get_num_threads())
    assert torch.equal(kernel.linear(x, blocks, scales), batch)


def test_mxfp4_linear_paths_agree() -> None:
    blocks, scales = random_mxfp4(40, 128, seed=2)
    x = torch.randn(mxfp4.MXFP4_MAX_ROWS + 3, 128, generator=torch.Generator().manual_seed(3))
    bias = torch.randn(40)
    many = mxfp4.mxfp4_linear(x, blocks, scales, bias)  # dequantized + F.linear
    few = mxfp4.mxfp4_linear(x[:4], blocks, scales, bias)  # the kernel (if built)
    torch.testing.assert_close(few, many[:4], rtol=1e-5, atol=1e-5)
    assert_close(many - bias, x, blocks, scales)


def test_packer_round_trip() -> None:
    w = torch.randn(8, 256, generator=torch.Generator().manual_seed(4))
    w[0, :32] = torch.tensor(E2M1_ROW) * 4  # exactly representable at scale 2^2
    blocks, scales = pack_mxfp4(w)
    back = dequantize_reference(blocks, scales)
    assert torch.equal(back[0, :32], w[0, :32])
    groups = w.unflatten(-1, (-1, 32))
    step = unit_of(scales)[..., None]  # the block's unit
    err = (back.unflatten(-1, (-1, 32)) - groups).abs()
    assert (err <= step + 1e-12).all()  # e2m1's widest gap (4 -> 6) is 2 units: half is 1
    assert (back.unflatten(-1, (-1, 32)).abs().amax(-1) <= 6 * step[..., 0]).all()


E2M1_ROW = [v for v in mxfp4.E2M1 for _ in range(2)]


def test_bad_inputs_refused(kernel: Mxfp4Gemm) -> None:
    blocks, scales = random_mxfp4(4, 64)
    with pytest.raises(ValueError, match="float32"):
        kernel.linear(torch.zeros(1, 64, dtype=torch.float64), blocks, scales)
    with pytest.raises(ValueError, match=r"float32 \[..., 64\]"):
        kernel.linear(torch.zeros(1, 96), blocks, scales)
    with pytest.raises(ValueError, match="do not match"):
        kernel.linear(torch.zeros(1, 64), blocks, scales[:, :1].contiguous())
    with pytest.raises(ValueError, match="uint8"):
        kernel.linear(torch.zeros(1, 64), blocks.view(torch.int8), scales)
    with pytest.raises(ValueError, match="bias"):
        kernel.linear(torch.zeros(1, 64), blocks, scales, torch.zeros(5))
    with pytest.raises(ValueError, match="NaN or overflow"):
        check_scales(torch.tensor([[127, 255]], dtype=torch.uint8))
    check_scales(torch.tensor([[0, MAX_SCALE]], dtype=torch.uint8))


def test_unavailable_without_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert_unavailable_without_compiler(
        mxfp4.load_mxfp4.__wrapped__, "native MXFP4 GEMM unavailable", tmp_path, monkeypatch, caplog
    )


def test_mxfp4_linear_without_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks, scales = random_mxfp4(12, 64, seed=9)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(9))
    monkeypatch.setattr(mxfp4, "load_mxfp4", lambda: None)  # no compiler, HYBRIDKV_NATIVE=0
    got = mxfp4.mxfp4_linear(x, blocks, scales, None)
    assert_close(got, x, blocks, scales)
    with pytest.raises(ValueError, match="do not match"):
        mxfp4.mxfp4_linear(x, blocks, scales[:, :1].contiguous(), None)

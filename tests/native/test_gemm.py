"""The skinny GEMM (``native/gemm.c``) against a float64 ``F.linear``: every row count of a
decode step and past it, weight row counts off the tile, odd K (the vector tail), biases,
strided and 3-D inputs; bitwise the same on one or two threads and for a row alone or in any
batch; bad inputs refused; without a compiler the loader returns None."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hybridkv.native import gemm
from hybridkv.native.gemm import SkinnyGemm
from tests.native.no_compiler import assert_unavailable_without_compiler, built_or_skip

RTOL = 1e-5


@pytest.fixture(scope="module")
def kernel(isa: str) -> SkinnyGemm:
    return built_or_skip(gemm.load_gemm(isa))


@pytest.fixture(autouse=True)
def restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _case(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen) * 0.1,
            torch.randn(n, generator=gen))  # fmt: skip


def _close(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert got.shape == ref.shape and got.dtype == torch.float32
    if ref.numel():
        scale = max(ref.abs().max().item(), 1.0)
        assert (got.double() - ref).abs().max().item() <= RTOL * scale


@pytest.mark.parametrize("m", [0, 1, 2, 3, 4, 5, 7, 12, 16, 17, 33, 40])
@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 13), (130, 768), (6, 2049), (33, 40)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64_reference(kernel: SkinnyGemm, m: int, n: int, k: int, bias: bool) -> None:
    x, w, b = _case(m, n, k, seed=m * 7 + n)
    bias_or_none = b if bias else None
    _close(kernel.linear(x, w, bias_or_none), x, w, bias_or_none)


def test_strided_and_3d_inputs(kernel: SkinnyGemm) -> None:
    fused = torch.randn(9, 3 * 96)
    x = fused[:, 96:192]  # a view of a fused projection: row stride 288
    _, w, b = _case(1, 50, 96)
    _close(kernel.linear(x, w, b), x, w, b)
    x3 = torch.randn(4, 2, 96).transpose(0, 1)  # [2, 4, 96], not contiguous
    got = kernel.linear(x3, w, b)
    assert got.shape == (2, 4, 50)
    _close(got.reshape(8, 50), x3.reshape(8, 96), w, b)
    col = torch.randn(96, 5).t()  # elements strided: copied
    _close(kernel.linear(col, w), col, w, None)


@pytest.mark.parametrize(("n", "k"), [(4096, 768), (770, 2048), (300, 333)])
def test_thread_count_and_batch_do_not_change_bits(kernel: SkinnyGemm, n: int, k: int) -> None:
    x, w, b = _case(16, n, k)
    torch.set_num_threads(1)
    one = kernel.linear(x, w, b)
    torch.set_num_threads(2)
    two = kernel.linear(x, w, b)
    assert torch.equal(one, two)
    for rows in (slice(0, 1), slice(3, 8), slice(5, 16)):  # other tiles, alone or batched
        assert torch.equal(kernel.linear(x[rows], w, b), one[rows])


def test_bad_inputs_are_refused(kernel: SkinnyGemm) -> None:
    x, w, b = _case(2, 8, 16)
    with pytest.raises(ValueError, match="float32 only"):
        kernel.linear(x.double(), w)
    with pytest.raises(ValueError, match="contiguous"):
        kernel.linear(x, w.t().contiguous().t())
    with pytest.raises(ValueError, match=r"\[N, K\]"):
        kernel.linear(torch.randn(2, 15), w)
    with pytest.raises(ValueError, match="bias"):
        kernel.linear(x, w, torch.randn(7))


def test_unavailable_without_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert_unavailable_without_compiler(
        gemm.load_gemm.__wrapped__, "native skinny GEMM unavailable", tmp_path, monkeypatch, caplog
    )

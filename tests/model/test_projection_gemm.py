"""float32 projections (``layers/linear.py`` ``ProjectionGemm``) against ``F.linear``: few rows
go to the native skinny GEMM, more rows, other dtypes and autograd to ``F.linear``; bfloat16
inputs are multiplied in float32 and rounded back; fused parts side by side; without the
kernel everything takes ``F.linear``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from hybridkv.model.layers.fused import FusedLinear
from hybridkv.model.layers.linear import SKINNY_MAX_ROWS, Linear, ProjectionGemm, linear
from hybridkv.native.gemm import SkinnyGemm, load_gemm
from tests.native.no_compiler import built_or_skip


class CountingKernel:
    """The real kernel, counting its calls."""

    def __init__(self, kernel: SkinnyGemm) -> None:
        self.kernel, self.calls = kernel, 0

    def linear(self, *args: Any) -> torch.Tensor:
        self.calls += 1
        return self.kernel.linear(*args)


@pytest.fixture
def counting() -> CountingKernel:
    return CountingKernel(built_or_skip(load_gemm()))


def _layer(k: int, n: int, bias: bool, counting: CountingKernel | None, seed: int = 0) -> Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = Linear(k, n, bias=bias).requires_grad_(False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=gen) * 0.05)
        if layer.bias is not None:
            layer.bias.copy_(torch.randn(n, generator=gen))
    layer.gemm.kernel = counting  # type: ignore[assignment]
    return layer


@pytest.mark.parametrize("bias", [False, True])
def test_few_rows_take_the_kernel_more_take_f_linear(counting: CountingKernel, bias: bool) -> None:
    layer = _layer(512, 160, bias, counting)
    for rows, calls in ((1, 1), (7, 2), (SKINNY_MAX_ROWS, 3), (SKINNY_MAX_ROWS + 1, 3)):
        x = torch.randn(rows, 512)
        with torch.inference_mode():
            got = layer(x)
        assert torch.allclose(got, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        assert counting.calls == calls, f"{rows} rows"


def test_small_weights_take_f_linear(counting: CountingKernel) -> None:
    layer = _layer(64, 128, False, counting)  # 8,192 elements: F.linear is level and cheaper
    x = torch.randn(2, 64)
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert counting.calls == 0


def test_3d_non_contiguous_and_bfloat16_inputs(counting: CountingKernel) -> None:
    layer = _layer(512, 160, True, counting)
    x = torch.randn(8, 3, 512).transpose(0, 1)  # [3, 8, 512], not contiguous
    with torch.inference_mode():
        assert torch.allclose(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5)
        xb = x.to(torch.bfloat16)
        got = layer(xb)
        ref = F.linear(xb.float(), layer.weight, layer.bias)
        exact = counting.kernel.linear(xb.float(), layer.weight, layer.bias).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, exact)  # float32, rounded once
    assert torch.allclose(got.float(), ref, rtol=1e-2, atol=1e-2)
    assert counting.calls == 2


def test_fused_parts_side_by_side(counting: CountingKernel) -> None:
    parts = [_layer(512, n, False, None, seed=n) for n in (64, 32, 32)]
    fused = FusedLinear(parts)
    fused._gemm.kernel = counting  # type: ignore[assignment]
    x = torch.randn(9, 512)
    with torch.inference_mode():
        got = fused(x)
    ref = torch.cat([F.linear(x, p.weight) for p in parts], dim=-1)
    assert torch.allclose(got, ref, atol=1e-5) and counting.calls == 1


def test_autograd_and_other_dtypes_use_f_linear(counting: CountingKernel) -> None:
    layer = Linear(512, 128)  # requires grad: the kernel has no backward
    layer.gemm.kernel = counting  # type: ignore[assignment]
    x = torch.randn(3, 512, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    with torch.inference_mode():
        layer.to(torch.float64)(torch.randn(3, 512, dtype=torch.float64))
    assert counting.calls == 0


def test_without_the_kernel_f_linear() -> None:
    gemm = ProjectionGemm()
    gemm.kernel = None
    x, w = torch.randn(4, 32), torch.randn(16, 32)
    assert not gemm.takes(x, w, None)
    assert torch.equal(gemm(x, w, None), F.linear(x, w))


def test_plain_linear_shares_the_policy(counting: CountingKernel) -> None:
    """``linear`` (MoE experts) takes the kernel for few rows of a contiguous float32 weight;
    a transposed view (gpt-oss experts) takes ``F.linear``."""
    x, w = torch.randn(3, 512), torch.randn(160, 512)
    with torch.inference_mode():
        assert torch.equal(linear(x, w), counting.kernel.linear(x, w))
        wt = torch.randn(512, 160).t()
        assert torch.equal(linear(x, wt), F.linear(x, wt))

"""MKL-packed float32 projections (``layers/linear.py``) against ``F.linear``: any row count
from one packing, biases, non-contiguous and bfloat16 inputs, repacking after the weight
changes, and the switch that turns packing off."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from hybridkv.model.layers.fused import FusedLinear
from hybridkv.model.layers.linear import Linear, PackedWeight, packing_enabled

pytestmark = pytest.mark.skipif(not packing_enabled(), reason="torch built without MKL")


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The packed path runs on a one-thread pool only (MKL's packed sgemm is serial)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_larger_pool_takes_plain_f_linear() -> None:
    layer = _layer(256, 160, bias=True)
    x = torch.randn(16, 256)
    torch.set_num_threads(2)
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert layer.packed._packed is None, "packed on a pool of 2"


def _layer(k: int, n: int, bias: bool, seed: int = 0) -> Linear:
    gen = torch.Generator().manual_seed(seed)
    layer = Linear(k, n, bias=bias).requires_grad_(False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(n, k, generator=gen) * 0.05)
        if layer.bias is not None:
            layer.bias.copy_(torch.randn(n, generator=gen))
    return layer


@pytest.mark.parametrize("rows", [0, 1, 7, 16, 100, 2048])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_matches_f_linear_at_any_row_count(rows: int, bias: bool) -> None:
    layer = _layer(256, 160, bias)
    x = torch.randn(rows, 256)
    with torch.inference_mode():
        got, ref = layer(x), F.linear(x, layer.weight, layer.bias)
    assert got.shape == ref.shape
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert layer.packed._packed is not None, "the packed path was not taken"


def test_3d_non_contiguous_and_bfloat16_inputs() -> None:
    layer = _layer(256, 160, bias=True)
    x = torch.randn(48, 3, 256).transpose(0, 1)  # [3, 48, 256], not contiguous
    with torch.inference_mode():
        assert torch.allclose(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5)
        xb = x.to(torch.bfloat16)
        got = layer(xb)
        ref = F.linear(xb.float(), layer.weight, layer.bias).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and torch.equal(got, ref)


def test_repacks_when_the_weight_changes() -> None:
    layer = _layer(256, 128, bias=False)
    x = torch.randn(5, 256)
    with torch.inference_mode():
        layer(x)
    with torch.no_grad():
        layer.weight.mul_(2.0)  # in place: same tensor, new version
    with torch.inference_mode():
        assert torch.allclose(layer(x), F.linear(x, layer.weight), atol=1e-5)
    layer.weight = torch.nn.Parameter(torch.randn(128, 256) * 0.05, requires_grad=False)  # new
    with torch.inference_mode():
        assert torch.allclose(layer(x), F.linear(x, layer.weight), atol=1e-5)


def test_fused_parts_are_packed_together() -> None:
    parts = [_layer(256, n, bias=False, seed=n) for n in (64, 32, 32)]
    fused = FusedLinear(parts)
    x = torch.randn(9, 256)
    with torch.inference_mode():
        got = fused(x)
    ref = torch.cat([F.linear(x, p.weight) for p in parts], dim=-1)
    assert torch.allclose(got, ref, atol=1e-5)


def test_autograd_uses_f_linear() -> None:
    layer = Linear(256, 128)  # requires grad: the packed op has no autograd formula
    x = torch.randn(3, 256, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None and layer.packed._packed is None


def test_small_weights_stay_unpacked() -> None:
    layer = _layer(64, 128, bias=False)  # 8,192 elements: packing gains nothing
    with torch.inference_mode():
        x = torch.randn(2, 64)
        assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert layer.packed._packed is None


def test_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDKV_PACKED_GEMM", "0")
    layer = _layer(256, 128, bias=False)
    with torch.inference_mode():
        layer(torch.randn(2, 256))
    assert not PackedWeight().enabled and layer.packed._packed is None

"""The native row kernels (RMS norm with a fused residual add, rotary in place) against the
layers' torch code, their reference: exact to 1e-5 in float32 for plain, offset (Gemma) and
per-head (q/k) norms, strided inputs and partial rotary; bad shapes are refused; without the
kernels (no compiler, ``HYBRIDKV_NATIVE=0``) the layers take the torch path."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hybridkv.model.config.rope import RopeConfig
from hybridkv.model.layers import norm as norm_module
from hybridkv.model.layers import rotary as rotary_module
from hybridkv.model.layers.norm import OffsetRMSNorm, RMSNorm
from hybridkv.model.layers.rotary import RotaryTable
from hybridkv.native import rownorm
from hybridkv.native.rownorm import RowKernels
from tests.native.no_compiler import built_or_skip

TOL = 1e-5


@pytest.fixture(scope="module")
def kernels(isa: str) -> RowKernels:
    return built_or_skip(rownorm.load_rownorm(isa))


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and (a - b).abs().max().item() <= TOL


@pytest.mark.parametrize("tokens", [1, 16, 300])  # 300 x 256: the OpenMP branch
def test_norm_and_fused_residual(kernels: RowKernels, tokens: int) -> None:
    gen = torch.Generator().manual_seed(tokens)
    x, res = torch.randn(tokens, 256, generator=gen), torch.randn(tokens, 256, generator=gen)
    w = torch.randn(256, generator=gen)
    _close(kernels.rms_norm(x, w, 1e-6), F.rms_norm(x, (256,), w, 1e-6))
    want_res = res + x
    want = F.rms_norm(want_res, (256,), w, 1e-6)
    got = kernels.rms_norm(x, w, 1e-6, residual=res)
    _close(res, want_res)
    _close(got, want)
    y = x.clone()
    kernels.rms_norm(y, w, 1e-6, out=y)  # in place
    _close(y, F.rms_norm(x, (256,), w, 1e-6))


@pytest.mark.parametrize("tokens", [1, 300])
def test_scaled_residual_add_has_torchs_bits(kernels: RowKernels, tokens: int) -> None:
    """``x_scale`` (Granite's residual multiplier): the residual and x come out bit for bit as
    ``residual.add_(x.mul_(s))`` (one rounding each: no fused multiply-add), the norm as the
    unscaled call's on that residual; without a residual it is refused."""
    gen = torch.Generator().manual_seed(tokens)
    x, res = torch.randn(tokens, 256, generator=gen), torch.randn(tokens, 256, generator=gen)
    w = torch.randn(256, generator=gen)
    want_x, want_res = x.clone(), res.clone()
    want_res.add_(want_x.mul_(0.22))
    got_x, got_res = x.clone(), res.clone()
    got = kernels.rms_norm(got_x, w, 1e-6, residual=got_res, x_scale=0.22)
    assert torch.equal(got_x, want_x) and torch.equal(got_res, want_res)
    assert torch.equal(got, kernels.rms_norm(want_res, w, 1e-6))
    with pytest.raises(ValueError, match="x_scale"):
        kernels.rms_norm(x, w, 1e-6, x_scale=0.5)


def test_per_head_rows_from_a_strided_view(kernels: RowKernels) -> None:
    qkv = torch.randn(5, 4 + 2 + 2, 16)  # [T, heads + 2 kv, d]: q/k is a strided view
    qk = qkv[:, :6]
    scale = torch.randn(6, 16)
    want = F.rms_norm(qk.clone(), (16,), eps=1e-6) * scale
    _close(kernels.rms_norm(qk, scale, 1e-6), want)


def test_layers_match_their_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(3)
    x, res = torch.randn(7, 64, generator=gen), torch.randn(7, 64, generator=gen)
    for layer in (RMSNorm(64, 1e-6), OffsetRMSNorm(64, 1e-6)):
        with torch.no_grad():
            layer.weight.copy_(torch.randn(64, generator=gen))
        with torch.inference_mode():
            native = (layer(x), layer.add_norm(x, res.clone()), layer.norm_(x.clone()))
            monkeypatch.setattr(norm_module, "load_rownorm", lambda: None)
            ref = (layer(x), layer.add_norm(x, res.clone()), layer.norm_(x.clone()))
            if isinstance(layer, RMSNorm):  # x_scale: the residual's bits on both paths
                ref_res = res.clone()
                ref_scaled = layer.add_norm(x.clone(), ref_res, 0.22)
                monkeypatch.undo()
                native_res = res.clone()
                _close(layer.add_norm(x.clone(), native_res, 0.22), ref_scaled)
                assert torch.equal(native_res, ref_res) and torch.equal(ref_res, res + x * 0.22)
            monkeypatch.undo()
        for a, b in zip(native, ref, strict=True):
            _close(a, b)


@pytest.mark.parametrize("rot_dim", [16, 8])  # whole heads; partial rotary
def test_rope_in_place_matches_torch(kernels: RowKernels, rot_dim: int) -> None:
    table = RotaryTable(RopeConfig(theta=10000.0, dim=rot_dim), initial_len=64)
    positions = torch.tensor([0, 5, 63, 17])
    qkv = torch.randn(4, 3 + 1 + 1, 16)
    with torch.inference_mode():
        native = table.lookup(positions, 63, torch.float32)
        assert native.native is not None
        ref = table.lookup(positions, 63, torch.float32)
        ref.native = None
        want = ref.apply(qkv[:, :4].clone())
        got = native.apply(qkv[:, :4])  # a strided view, rotated in place
    _close(got, want)
    _close(qkv[:, :4], want)


@pytest.mark.parametrize("rot_dim", [16, 8])
@pytest.mark.parametrize("tokens", [4, 300])  # 300 x 5 heads x 16: the OpenMP branch
def test_norm_then_rope_in_one_pass_equals_the_two_calls(
    kernels: RowKernels, rot_dim: int, tokens: int
) -> None:
    """q/k norms and rotary fused (``rms_norm_rope_``): the same bits as ``rms_norm`` then
    ``rope_``, in place on the q/k view of a q/k/v projection."""
    table = RotaryTable(RopeConfig(theta=10000.0, dim=rot_dim), initial_len=512)
    gen = torch.Generator().manual_seed(tokens)
    positions = torch.randint(0, 512, (tokens,), generator=gen)
    qkv = torch.randn(tokens, 4 + 2 + 2, 16, generator=gen)
    scale = torch.randn(6, 16, generator=gen)
    want = kernels.rms_norm(qkv[:, :6], scale, 1e-6)
    kernels.rope_(want, table.cos, table.sin, positions)
    v = qkv[:, 6:].clone()
    got = kernels.rms_norm_rope_(qkv[:, :6], scale, 1e-6, table.cos, table.sin, positions)
    assert got.data_ptr() == qkv.data_ptr() and torch.equal(got, want)
    assert torch.equal(qkv[:, 6:], v)  # the v heads untouched


def test_bad_shapes_are_refused(kernels: RowKernels) -> None:
    with pytest.raises(ValueError, match="scale"):
        kernels.rms_norm(torch.randn(2, 8), torch.randn(4), 1e-6)
    with pytest.raises(ValueError, match="float32"):
        kernels.rms_norm(torch.randn(2, 8).double(), torch.randn(8), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        kernels.rms_norm(torch.randn(2, 8), torch.randn(8), 1e-6, residual=torch.randn(3, 8))
    with pytest.raises(ValueError, match="packed"):
        kernels.rms_norm(torch.randn(2, 8, 4).transpose(1, 2), torch.randn(8), 1e-6)
    with pytest.raises(ValueError, match="rotary tables"):
        kernels.rope_(torch.randn(2, 1, 8), torch.randn(4, 10), torch.randn(4, 10), torch.zeros(2))


def test_without_kernels_the_layers_use_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("HYBRIDKV_NATIVE", raising=False)  # the compiler's absence, not the switch
    monkeypatch.setenv("HYBRIDKV_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.WARNING, logger="hybridkv.native"):
        assert rownorm.load_rownorm.__wrapped__() is None
    assert "native row kernels unavailable" in caplog.text
    monkeypatch.setattr(norm_module, "load_rownorm", lambda: None)
    monkeypatch.setattr(rotary_module, "load_rownorm", lambda: None)
    layer, x = RMSNorm(8, 1e-6), torch.randn(3, 8)
    table = RotaryTable(RopeConfig(theta=10000.0, dim=8), initial_len=8)
    with torch.inference_mode():
        _close(layer(x), F.rms_norm(x, (8,), layer.weight, 1e-6))
        assert table.lookup(torch.arange(3), 2, torch.float32).native is None


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("tokens", [1, 5, 200])  # 200 x 512: the OpenMP branch
def test_act_mul_matches_torch(kernels: RowKernels, act: str, tokens: int) -> None:
    gate_up = torch.randn(tokens, 2 * 512) * 3
    gate, up = gate_up.chunk(2, dim=-1)
    fn = F.silu if act == "silu" else (lambda x: F.gelu(x, approximate="tanh"))
    got, want = kernels.act_mul(gate_up, act), fn(gate) * up  # |values| up to ~100
    torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)
    with pytest.raises(ValueError, match="activation"):
        kernels.act_mul(gate_up, "relu2")


HOSTILE = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40, -1e-40, 100.0, -100.0,
           -87.5, 88.9, 3.4e38, -3.4e38]  # fmt: skip


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_act_mul_bits_do_not_depend_on_the_position(kernels: RowKernels, act: str) -> None:
    """Every value gives the same bits wherever it sits in a row: in the vectorized body or
    the scalar tail (the loop vectorizes: -fno-trapping-math, native/__init__.py), for hostile values
    too (NaN, infinities, signed zeros, denormals, the exp clamp, overflow)."""
    inner = 67  # 8-wide body + a 3-value tail, so each shift moves values between the two
    gate = torch.cat([torch.tensor(HOSTILE), torch.randn(inner - len(HOSTILE)) * 8])
    up = torch.randn(inner) * 3
    want = kernels.act_mul(torch.cat([gate, up])[None], act)[0]
    for shift in range(1, 12):
        rolled = torch.cat([gate.roll(shift), up.roll(shift)])[None]
        got = kernels.act_mul(rolled, act)[0].roll(-shift)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), shift
    finite = gate.isfinite() & (gate.abs() < 50)
    fn = F.silu if act == "silu" else (lambda x: F.gelu(x, approximate="tanh"))
    torch.testing.assert_close(want[finite], (fn(gate) * up)[finite], rtol=TOL, atol=TOL)

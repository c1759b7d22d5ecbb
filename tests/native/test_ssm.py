"""The fused Mamba2 decode step (``native/ssm.c``) against the mixer's torch step
(``Mamba2Mixer._decode``, its reference), exact to 1e-5 in float32: conv + SiLU, dt softplus
and clamp, grouped B/C, the skip term, both states updated in place on scattered slots, outputs
written to the decode tokens' rows only; its fused output norm is ``GatedRMSNorm``'s kernel
bit for bit; the same bits on 1 and 2 threads; bad input refused
before anything is written; without a compiler there is no kernel."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from hybridkv.model.config.mamba import MambaConfig
from hybridkv.model.layers.mamba2 import Mamba2Mixer
from hybridkv.model.layers.step_context import StateMeta
from hybridkv.native import ssm
from hybridkv.native.ssm import MambaWeights, SsmKernels, StepNorm
from tests.native.no_compiler import built_or_skip


@pytest.fixture(scope="module")
def kernels(isa: str) -> SsmKernels:
    return built_or_skip(ssm.load_ssm(isa))


def make_mixer(heads: int, groups: int, p: int, n: int, conv_bias: bool) -> Mamba2Mixer:
    cfg = MambaConfig(heads, p, n, groups, 4, 8, conv_bias, False, 0.05, 0.8)
    mixer = Mamba2Mixer(0, 16, cfg, 1e-6).requires_grad_(False)
    gen = torch.Generator().manual_seed(heads * 100 + groups)
    for param in mixer.parameters():
        param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    return mixer


def decode_meta(tokens: torch.Tensor, slots: torch.Tensor) -> StateMeta:
    empty = torch.zeros(0, dtype=torch.int64)
    no_rows = torch.zeros(0, 1, dtype=torch.int64)
    return StateMeta(tokens, slots, None, no_rows, no_rows.bool(), empty, empty, empty)


def step_case(
    mixer: Mamba2Mixer, rows: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """proj ``[T, ...]`` (T = rows + 3), decode tokens, scattered slots, conv/SSM states."""
    cfg, gen = mixer.cfg, torch.Generator().manual_seed(seed)
    width = cfg.intermediate_size + cfg.conv_dim + cfg.num_heads
    proj = torch.randn(rows + 3, width, generator=gen)
    tokens = torch.randperm(rows + 3, generator=gen)[:rows]
    slots = torch.randperm(rows + 4, generator=gen)[:rows]
    conv = torch.randn(rows + 4, cfg.conv_dim, cfg.d_conv - 1, generator=gen)
    states = torch.randn(rows + 4, cfg.num_heads, cfg.head_dim, cfg.d_state, generator=gen)
    return proj, tokens, slots, conv, states


def step_weights(mixer: Mamba2Mixer) -> MambaWeights:
    kernels = ssm.load_ssm()
    assert kernels is not None
    step = mixer._build_step(kernels, mixer._step_params())
    assert step is not None
    return step.weights


def run_kernel(
    kernels: SsmKernels, mixer: Mamba2Mixer, case: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    proj, tokens, slots, conv, states = (t.clone() for t in case)
    y = torch.full((proj.shape[0], mixer.cfg.intermediate_size), -7.0)
    weights = step_weights(mixer)
    kernels.mamba_step_((conv, states), slots, tokens, proj, weights, y)
    return y, conv, states


@pytest.mark.parametrize(
    ("rows", "heads", "groups", "bias"), [(1, 4, 1, True), (5, 6, 2, False), (9, 24, 1, True)]
)
def test_step_matches_torch(
    kernels: SsmKernels, rows: int, heads: int, groups: int, bias: bool
) -> None:
    mixer = make_mixer(heads, groups, 16, 32, bias)
    case = step_case(mixer, rows, seed=rows)
    proj, tokens, slots, conv, states = (t.clone() for t in case)
    cfg = mixer.cfg
    _, xbc, dt = torch.split(proj, [cfg.intermediate_size, cfg.conv_dim, cfg.num_heads], -1)
    want = mixer._decode(xbc, dt, conv, states, decode_meta(tokens, slots))
    got, got_conv, got_states = run_kernel(kernels, mixer, case)
    assert (got[tokens] - want).abs().max().item() < 1e-5
    others = torch.ones(proj.shape[0], dtype=torch.bool)
    others[tokens] = False
    assert bool((got[others] == -7.0).all())  # other tokens' rows untouched
    assert torch.equal(got_conv, conv)  # the window shift is exact; other slots untouched
    assert (got_states - states).abs().max().item() < 1e-5
    idle = torch.ones(states.shape[0], dtype=torch.bool)
    idle[slots] = False
    assert torch.equal(got_states[idle], case[4][idle])


@pytest.mark.parametrize(("groups", "gate_first"), [(1, True), (2, False)])
def test_fused_norm_is_the_gated_norm_bit_for_bit(
    kernels: SsmKernels, isa: str, groups: int, gate_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybridkv.model.layers import norm as norm_module
    from hybridkv.model.layers.norm import GatedRMSNorm
    from hybridkv.native.ssm_prefill import load_ssm_prefill

    monkeypatch.setattr(norm_module, "load_ssm_prefill", lambda: load_ssm_prefill(isa))
    mixer = make_mixer(6, groups, 16, 32, True)
    case = step_case(mixer, 4, seed=5)
    proj, tokens, slots, conv, states = (t.clone() for t in case)
    inner = mixer.cfg.intermediate_size
    norm = GatedRMSNorm(inner, groups, 1e-5, norm_before_gate=not gate_first)
    norm.weight.data.uniform_(0.5, 1.5)
    y, _, _ = run_kernel(kernels, mixer, case)
    with torch.no_grad():  # GatedRMSNorm's native kernel (the torch path differs in order)
        want = norm(y[tokens], proj[tokens, :inner])
    fused = torch.zeros(proj.shape[0], inner)
    step_norm = StepNorm(norm.weight.detach(), groups, 1e-5, gate_first)
    weights = step_weights(mixer)
    kernels.mamba_step_((conv, states), slots, tokens, proj, weights, fused, step_norm)
    assert torch.equal(fused[tokens], want)


def test_same_bits_on_one_and_two_threads(kernels: SsmKernels) -> None:
    mixer = make_mixer(8, 1, 32, 64, True)
    case = step_case(mixer, 17, seed=3)  # 17 * 8 * 32 * 64 > the kernel's parallel threshold
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run_kernel(kernels, mixer, case)
        torch.set_num_threads(2)
        two = run_kernel(kernels, mixer, case)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))


def test_bad_input_is_refused_before_any_write(kernels: SsmKernels) -> None:
    mixer = make_mixer(4, 1, 16, 32, True)
    proj, tokens, slots, conv, states = step_case(mixer, 3, seed=1)
    weights = step_weights(mixer)
    y = torch.zeros(proj.shape[0], mixer.cfg.intermediate_size)
    conv0, states0 = conv.clone(), states.clone()
    bad_slots = slots.clone()
    bad_slots[-1] = states.shape[0]
    with pytest.raises(IndexError, match="slot"):
        kernels.mamba_step_((conv, states), bad_slots, tokens, proj, weights, y)
    assert torch.equal(conv, conv0) and torch.equal(states, states0)
    with pytest.raises(ValueError, match="ssm states"):
        kernels.mamba_step_((conv, states.transpose(2, 3)), slots, tokens, proj, weights, y)
    with pytest.raises(ValueError, match="proj"):
        kernels.mamba_step_((conv, states), slots, tokens, proj[:, 1:], weights, y)
    short = MambaWeights(weights.conv_w[:-1], None, weights.dt_bias, weights.a, None, (0, 1))
    with pytest.raises(ValueError, match="conv"):
        kernels.mamba_step_((conv, states), slots, tokens, proj, short, y)


def test_without_a_compiler_there_is_no_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("HYBRIDKV_NATIVE", raising=False)
    monkeypatch.setenv("HYBRIDKV_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.WARNING, logger="hybridkv.native"):
        assert ssm.load_ssm.__wrapped__() is None
    assert "native Mamba2 step unavailable" in caplog.text


def test_the_mixer_keeps_its_step_until_a_parameter_changes(kernels: SsmKernels) -> None:
    mixer = make_mixer(4, 1, 16, 32, True)
    proj, _, _, conv, states = step_case(mixer, 2, seed=2)
    with torch.no_grad():
        first = mixer._native_step(proj, conv, states)
        assert first is not None and mixer._native_step(proj, conv, states) is first
        mixer.A_log.add_(0.5)  # in place: same tensor, new version
        again = mixer._native_step(proj, conv, states)
        assert again is not None and again is not first
        assert torch.equal(again.weights.a, -torch.exp(mixer.A_log))
    assert mixer._native_step(proj, conv, states) is None  # autograd: the torch step
    with torch.no_grad():
        mixer.D.data = mixer.D.data.to(torch.bfloat16)  # the kernel is float32 only
        assert mixer._native_step(proj, conv, states) is None

"""The Mamba2 decode kernel (``native/ssm.c``) against ``ssd_step_`` (its reference), exact to
1e-5 in float32: grouped B/C, the skip term, the state updated in place; bad shapes refused;
without the kernel the mixer keeps the torch step (``tests/model`` parity covers the mixer)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from hybridkv.model.layers.ssd import ssd_step_
from hybridkv.native import ssm
from hybridkv.native.ssm import SsmKernels
from tests.native.no_compiler import built_or_skip


@pytest.fixture(scope="module")
def kernels() -> SsmKernels:
    return built_or_skip(ssm.load_ssm())


@pytest.mark.parametrize(("rows", "heads", "groups"), [(1, 4, 1), (5, 6, 2), (16, 24, 1)])
def test_step_matches_torch(kernels: SsmKernels, rows: int, heads: int, groups: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    p, n = 16, 32
    state = torch.randn(rows, heads, p, n, generator=gen)
    x = torch.randn(rows, heads, p, generator=gen)
    dt = torch.rand(rows, heads, generator=gen) * 0.5
    a, d = -torch.rand(heads, generator=gen), torch.randn(heads, generator=gen)
    b, c = (torch.randn(rows, groups, n, generator=gen) for _ in range(2))
    per = heads // groups
    ref_state = state.clone()
    want = (
        ssd_step_(x, dt, a, b.repeat_interleave(per, 1), c.repeat_interleave(per, 1), ref_state)
        + x * d[:, None]
    )
    states = torch.randn(rows + 3, heads, p, n, generator=gen)  # rows live in scattered slots
    slots = torch.randperm(rows + 3, generator=gen)[:rows]
    states[slots] = state
    untouched = states.clone()
    got = kernels.ssd_step_(states, slots, x, dt, a, b, c, d)
    assert (got - want).abs().max().item() < 1e-5
    assert (states[slots] - ref_state).abs().max().item() < 1e-5
    others = torch.ones(rows + 3, dtype=torch.bool)
    others[slots] = False
    assert torch.equal(states[others], untouched[others])


def test_bad_shapes_are_refused(kernels: SsmKernels) -> None:
    state, x, dt = torch.zeros(2, 4, 8, 8), torch.zeros(2, 4, 8), torch.zeros(2, 4)
    a, b, slots = torch.zeros(4), torch.zeros(2, 1, 8), torch.tensor([1, 0])
    with pytest.raises(ValueError, match="dt"):
        kernels.ssd_step_(state, slots, x, torch.zeros(2, 3), a, b, b)
    with pytest.raises(ValueError, match="states"):
        kernels.ssd_step_(state.transpose(2, 3), slots, x, dt, a, b, b)
    with pytest.raises(ValueError, match="groups"):
        kernels.ssd_step_(state, slots, x, dt, a, torch.zeros(2, 3, 8), torch.zeros(2, 3, 8))
    with pytest.raises(IndexError, match="slot"):
        kernels.ssd_step_(state, torch.tensor([0, 2]), x, dt, a, b, b)


def test_without_a_compiler_there_is_no_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("HYBRIDKV_NATIVE", raising=False)
    monkeypatch.setenv("HYBRIDKV_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.WARNING, logger="hybridkv.native"):
        assert ssm.load_ssm.__wrapped__() is None
    assert "native Mamba2 step unavailable" in caplog.text


@pytest.mark.parametrize("bias", [True, False])
def test_conv_step_matches_torch(kernels: SsmKernels, bias: bool) -> None:
    from torch import nn

    from hybridkv.model.layers.short_conv import conv_step_

    gen = torch.Generator().manual_seed(7)
    conv = nn.Conv1d(12, 12, 4, groups=12, bias=bias).requires_grad_(False)
    states = torch.randn(6, 12, 3, generator=gen)
    slots = torch.tensor([4, 1, 2])
    x = torch.randn(3, 12, generator=gen)
    ref_states = states.clone()
    want = conv_step_(x, ref_states, slots, conv)
    got = kernels.conv_step_(states, slots, x, conv.weight[:, 0, :], conv.bias)
    assert (got - want).abs().max().item() < 1e-5
    assert (states - ref_states).abs().max().item() < 1e-6  # every slot: only live ones moved

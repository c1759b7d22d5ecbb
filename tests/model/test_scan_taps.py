"""States from inside a prefill's scan (``StateTaps``) equal the state a prefill that stopped
there would have left: Mamba2's chunked scan, the gated delta rule, the short conv, and a
whole runner step saving mid-chunk checkpoints (``StateCopy.at``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hybridkv.model.layers.delta_rule import chunk_gated_delta_rule
from hybridkv.model.layers.short_conv import conv_chunk_
from hybridkv.model.layers.ssd import ssd_chunk_scan
from hybridkv.model.layers.step_context import StateTaps
from hybridkv.step_io import StateCopy
from tests.model.conftest import make_runner
from tests.support.driver import RunnerDriver

LENS = (13, 9)  # two right-padded rows
TAPS = [(0, 1), (0, 4), (0, 5), (0, 12), (1, 8), (1, 3)]  # (row, tokens absorbed)


def _taps() -> tuple[torch.Tensor, torch.Tensor]:
    rows, lens = zip(*TAPS, strict=True)
    return torch.tensor(rows), torch.tensor(lens)


def _pad_mask(length: int) -> torch.Tensor:
    return torch.arange(length)[None, :] < torch.tensor(LENS)[:, None]  # [R, L]


def test_ssd_taps_equal_the_state_of_a_shorter_scan() -> None:
    gen = torch.Generator().manual_seed(0)
    r, length, h, p, n, chunk = 2, max(LENS), 3, 4, 5, 4
    valid = _pad_mask(length)
    x = torch.randn(r, length, h, p, generator=gen)
    dt = torch.rand(r, length, h, generator=gen).masked_fill(~valid[..., None], 0.0)
    a = -torch.rand(h, generator=gen)
    b, c = (torch.randn(r, length, h, n, generator=gen) for _ in range(2))
    init = torch.randn(r, h, p, n, generator=gen)
    _, _, tapped = ssd_chunk_scan(x, dt, a, b, c, init, chunk, _taps())
    assert tapped is not None
    for k, (row, m) in enumerate(TAPS):
        sl = slice(row, row + 1)
        _, ref, _ = ssd_chunk_scan(x[sl, :m], dt[sl, :m], a, b[sl, :m], c[sl, :m], init[sl], chunk)
        assert torch.allclose(tapped[k], ref[0], atol=1e-5), (row, m)


def test_gated_delta_taps_equal_the_state_of_a_shorter_rule() -> None:
    gen = torch.Generator().manual_seed(1)
    r, length, h, dk, dv, chunk = 2, max(LENS), 2, 4, 3, 4
    valid = _pad_mask(length)[..., None]
    q, k = (
        nn.functional.normalize(torch.randn(r, length, h, dk, generator=gen), dim=-1)
        for _ in range(2)
    )
    v = torch.randn(r, length, h, dv, generator=gen)
    g = (-torch.rand(r, length, h, generator=gen)).masked_fill(~valid, 0.0)
    beta = torch.rand(r, length, h, generator=gen).masked_fill(~valid, 0.0)
    init = torch.randn(r, h, dk, dv, generator=gen)
    _, _, tapped = chunk_gated_delta_rule(q, k, v, g, beta, init, chunk, _taps())
    assert tapped is not None
    for i, (row, m) in enumerate(TAPS):
        sl = slice(row, row + 1)
        parts = (t[sl, :m] for t in (q, k, v, g, beta))
        _, ref, _ = chunk_gated_delta_rule(*parts, init[sl], chunk)
        assert torch.allclose(tapped[i], ref[0], atol=1e-5), (row, m)


def test_conv_taps_keep_the_inputs_before_the_boundary() -> None:
    gen = torch.Generator().manual_seed(2)
    channels, kernel, length = 6, 4, max(LENS)
    conv = nn.Conv1d(channels, channels, kernel, groups=channels)
    padded = torch.randn(2, length, channels, generator=gen) * _pad_mask(length)[..., None]
    start = torch.randn(8, channels, kernel - 1, generator=gen)
    slots, lens = torch.tensor([0, 1]), torch.tensor(LENS)
    rows, absorbed = _taps()
    taps = StateTaps(rows, absorbed, torch.arange(2, 2 + len(TAPS)))
    state = start.clone()
    conv_chunk_(padded, state, slots, lens, conv, taps)
    for i, (row, m) in enumerate(TAPS):
        ref = start.clone()
        conv_chunk_(padded[row : row + 1, :m], ref, slots[row : row + 1], torch.tensor([m]), conv)
        assert torch.equal(state[2 + i], ref[row]), (row, m)


@pytest.mark.parametrize("boundary", [16, 32, 48])
def test_mid_chunk_checkpoint_equals_a_split_step(
    boundary: int, hf_checkpoints: dict[str, Path]
) -> None:
    """One 60-token step saving at ``boundary`` (scan chunk 16 of the tiny Granite or not)
    gives the slot a step ending there gives."""
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(3, 1000, (60,), generator=gen).tolist()
    runner = make_runner(hf_checkpoints["granitemoehybrid"])
    driver = RunnerDriver(runner)
    (gid,) = driver.layout.state_group_ids
    whole, split = driver.add("whole", tokens), driver.add("split", tokens)
    from_scan, from_step = driver.take_slot(), driver.take_slot()
    driver.step({"whole": 60}, saves=[StateCopy(gid, whole.slots[0], from_scan, at=boundary)])
    driver.step({"split": boundary}, saves=[StateCopy(gid, split.slots[0], from_step)])
    tensors = runner.cache._group_states[gid]  # every layer's conv and SSM state
    assert len(tensors) >= 4
    for t in tensors:
        assert torch.allclose(t[from_scan], t[from_step], atol=1e-5)
        assert not torch.equal(t[from_scan], t[whole.slots[0]])  # not the end state

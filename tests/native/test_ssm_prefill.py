"""The Mamba2 prefill kernels (``native/ssm_prefill.c``) against the torch path (``ssd_chunk_scan``
in float64, ``conv_chunk_`` + SiLU): rows of different lengths (1, below, at and across chunk
sizes) at scattered token starts and slots, non-zero initial states, mid-row taps, grouped B/C,
head and state sizes that are not a vector multiple; the same bits on 1 and 2 threads; bad
input refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.layers.short_conv import conv_chunk_
from hybridkv.model.layers.ssd import ssd_chunk_scan
from hybridkv.model.layers.step_context import StateTaps
from hybridkv.native import ssm_prefill
from hybridkv.native.ssm_prefill import PrefillRows, SsmPrefillKernels
from tests.native.no_compiler import assert_unavailable_without_compiler, built_or_skip

LENS = [1, 7, 16, 45, 130]  # the reference's chunk is 16
TAPS = ([1, 3, 3, 4, 4], [3, 1, 44, 16, 129])  # (row, tokens into the row): inside and at ends


@pytest.fixture(scope="module")
def kernels(isa: str) -> SsmPrefillKernels:
    return built_or_skip(ssm_prefill.load_ssm_prefill(isa))


def make_rows(num_slots: int, gen: torch.Generator, gap: int = 3) -> PrefillRows:
    """LENS rows with ``gap`` other tokens before each, in shuffled slots, with TAPS into the
    slots after the live ones."""
    lens = torch.tensor(LENS)
    starts = torch.cumsum(lens + gap, 0) - lens
    slots = torch.randperm(len(LENS), generator=gen)
    t_slots = torch.arange(len(TAPS[0])) + len(LENS)
    assert num_slots >= len(LENS) + len(TAPS[0])
    return PrefillRows(starts, lens, slots, (torch.tensor(TAPS[0]), torch.tensor(TAPS[1]), t_slots))


def padded(flat: torch.Tensor, rows: PrefillRows) -> torch.Tensor:
    """``[T, ...]`` -> ``[R, L, ...]`` (zeros past each row's length)."""
    out = flat.new_zeros(len(LENS), max(LENS), *flat.shape[1:])
    for r, (s, n) in enumerate(zip(rows.starts.tolist(), rows.lens.tolist(), strict=True)):
        out[r, :n] = flat[s : s + n]
    return out


@pytest.mark.parametrize(
    ("heads", "groups", "p", "n", "dt_max"),
    [(4, 1, 32, 16, 0.3), (6, 2, 24, 20, 0.3), (4, 2, 16, 16, 40.0)],  # 40: decays to ~0
)
def test_scan_matches_the_chunked_scan(
    kernels: SsmPrefillKernels, heads: int, groups: int, p: int, n: int, dt_max: float
) -> None:
    gen = torch.Generator().manual_seed(heads)
    rows = make_rows(12, gen)
    tokens = int((rows.starts + rows.lens).max()) + 2
    act = torch.randn(tokens, heads * p + 2 * groups * n, generator=gen)
    dt = torch.rand(tokens, heads, generator=gen) * dt_max
    a, d = -torch.rand(heads, generator=gen) * 2, torch.randn(heads, generator=gen)
    states = torch.randn(12, heads, p, n, generator=gen)
    want_y, want_states = reference_scan(act, dt, a, d, groups, states, rows)
    y = torch.full((tokens, heads * p), 7.0)
    kernels.ssd_scan_(states, rows, act, dt, a, d, groups, y)
    scale = want_y.abs().max()
    for r, (s, length) in enumerate(zip(rows.starts.tolist(), rows.lens.tolist(), strict=True)):
        assert (y[s : s + length] - want_y[r, :length].flatten(1)).abs().max() < 1e-5 * scale
    assert torch.all(y[: rows.starts[0]] == 7.0)  # other tokens untouched
    assert (states.double() - want_states).abs().max() < 1e-5 * want_states.abs().max()


def reference_scan(
    act: torch.Tensor,
    dt: torch.Tensor,
    a: torch.Tensor,
    d: torch.Tensor,
    groups: int,
    states: torch.Tensor,
    rows: PrefillRows,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``ssd_chunk_scan`` over the padded rows: y ``[R, L, h, p]`` and every slot's
    state after the call (live slots advanced, tap slots written)."""
    _, heads, p, n = states.shape
    x, b, c = padded(act.double(), rows).split([heads * p, groups * n, groups * n], -1)
    shape = (*x.shape[:2], groups, n)
    b, c = (t.reshape(shape).repeat_interleave(heads // groups, 2) for t in (b, c))
    x = x.reshape(*x.shape[:2], heads, p)
    assert rows.taps is not None
    t_rows, t_lens, t_slots = rows.taps
    y, final, tapped = ssd_chunk_scan(
        x, padded(dt.double(), rows), a.double(), b, c, states[rows.slots].double(), 16,
        (t_rows, t_lens),
    )  # fmt: skip
    out = states.double()
    out[rows.slots] = final
    assert tapped is not None
    out[t_slots] = tapped
    return y + x * d.double()[:, None], out


def scan_twice(
    kernels: SsmPrefillKernels, seed: int, p: int, between: Callable[[int], None]
) -> None:
    """The same scan of 10 rows (8 heads, state [p, 16]) run twice, ``between(0)`` and
    ``between(1)`` before each run: the states and outputs must be equal bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    heads, n = 8, 16
    rows = make_rows(10, gen)
    tokens = int((rows.starts + rows.lens).max())
    act = torch.randn(tokens, heads * p + 2 * n, generator=gen)
    dt, a = torch.rand(tokens, heads, generator=gen), -torch.rand(heads, generator=gen)
    start = torch.randn(10, heads, p, n, generator=gen)
    results = []
    for run in (0, 1):
        between(run)
        states, y = start.clone(), torch.zeros(tokens, heads * p)
        kernels.ssd_scan_(states, rows, act, dt, a, None, 1, y)
        results.append((states, y))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_thread_count_does_not_change_a_bit(kernels: SsmPrefillKernels) -> None:
    before = torch.get_num_threads()
    try:
        scan_twice(kernels, 3, 32, lambda run: torch.set_num_threads(run + 1))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("span", [1, 3, 8])
def test_head_span_does_not_change_a_bit(
    kernels: SsmPrefillKernels, span: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def choose(run: int) -> None:
        chosen = (span, 2)[run]
        monkeypatch.setattr(ssm_prefill, "_head_span", lambda heads, rows, k=chosen: k)

    scan_twice(kernels, 4, 16, choose)


@pytest.mark.parametrize(("bias", "in_place"), [(True, False), (False, False), (True, True)])
def test_conv_matches_torch(kernels: SsmPrefillKernels, bias: bool, in_place: bool) -> None:
    gen = torch.Generator().manual_seed(5)
    channels = 300  # more than one channel block of the kernel (256)
    conv = nn.Conv1d(channels, channels, 4, groups=channels, bias=bias).requires_grad_(False)
    rows = make_rows(12, gen)
    tokens = int((rows.starts + rows.lens).max())
    proj = torch.randn(tokens, channels + 5, generator=gen)
    x = proj[:, 2 : 2 + channels]  # a strided view, as the mixer's split of its projection
    raw = x.clone()
    states = torch.randn(12, channels, 3, generator=gen)
    ref_states = states.clone()
    assert rows.taps is not None
    taps = StateTaps(*rows.taps)
    valid = torch.arange(max(LENS))[None, :] < rows.lens[:, None]
    want = F.silu(conv_chunk_(padded(x, rows), ref_states, rows.slots, rows.lens, conv, taps))
    got = kernels.conv_chunk_(states, rows, x, conv.weight[:, 0, :], conv.bias, in_place)
    idx = (rows.starts[:, None] + torch.arange(max(LENS)))[valid]
    assert (got[idx] - want[valid]).abs().max().item() < 1e-5
    assert torch.equal(states, ref_states)  # live and tap slots: copies of the same inputs
    others = torch.ones(tokens, dtype=torch.bool)
    others[idx] = False
    if in_place:
        assert got.data_ptr() == x.data_ptr() and torch.equal(x[others], raw[others])
    else:
        assert torch.equal(x, raw)


def test_bad_input_is_refused(kernels: SsmPrefillKernels) -> None:
    states, act, dt = torch.zeros(4, 2, 8, 8), torch.zeros(10, 32), torch.zeros(10, 2)
    a, y = torch.zeros(2), torch.zeros(10, 16)
    ok = PrefillRows(torch.tensor([0, 5]), torch.tensor([5, 5]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="dt"):
        kernels.ssd_scan_(states, ok, act, torch.zeros(10, 3), a, None, 1, y)
    with pytest.raises(ValueError, match="groups"):
        kernels.ssd_scan_(states, ok, act, dt, a, None, 3, y)
    late = PrefillRows(torch.tensor([0, 6]), torch.tensor([5, 5]), torch.tensor([0, 1]))
    with pytest.raises(IndexError, match="past"):
        kernels.ssd_scan_(states, late, act, dt, a, None, 1, y)
    bad_slot = PrefillRows(torch.tensor([0, 5]), torch.tensor([5, 5]), torch.tensor([0, 4]))
    with pytest.raises(IndexError, match="slot"):
        kernels.ssd_scan_(states, bad_slot, act, dt, a, None, 1, y)
    one = torch.tensor([0])
    long_tap = PrefillRows(ok.starts, ok.lens, ok.slots, (one, torch.tensor([6]), one + 2))
    with pytest.raises(ValueError, match="tap lens"):
        kernels.ssd_scan_(states, long_tap, act, dt, a, None, 1, y)
    with pytest.raises(ValueError, match="conv kernel size"):
        kernels.conv_chunk_(torch.zeros(4, 8, 11), ok, act[:, :8], torch.zeros(8, 12), None)


def test_without_a_compiler_there_is_no_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    load = ssm_prefill.load_ssm_prefill.__wrapped__
    assert_unavailable_without_compiler(
        load, "native Mamba2 prefill unavailable", tmp_path, monkeypatch, caplog
    )


@pytest.mark.parametrize(("groups", "before"), [(1, False), (2, False), (2, True)])
def test_gated_norm_matches_torch(
    kernels: SsmPrefillKernels, groups: int, before: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybridkv.model.layers import norm

    gen = torch.Generator().manual_seed(groups)
    layer = norm.GatedRMSNorm(96, groups, 1e-6, norm_before_gate=before).requires_grad_(False)
    layer.weight.copy_(torch.randn(96, generator=gen))
    proj = torch.randn(9, 200, generator=gen) * 3
    y, gate = proj[:, :96].contiguous(), proj[:, 100:196]  # gate: a strided view
    scratch = y.clone()
    with torch.no_grad():  # as the engine runs (autograd keeps the torch path)
        got = layer(y, gate)
        assert torch.equal(layer(scratch, gate, scratch=True), got)
        assert torch.equal(scratch, got)  # written in place
        monkeypatch.setattr(norm, "load_ssm_prefill", lambda: None)  # the torch path
        want = layer(y, gate)
    assert (got - want).abs().max().item() < 1e-5 * want.abs().max().item()

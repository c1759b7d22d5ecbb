"""The token arithmetic of a transfer (no NIXL): ends, clipping, descriptors, merging."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from hybridkv.connectors.nixl import plan
from hybridkv.connectors.nixl.layout import GroupDesc, LayoutDescriptor, TensorDesc
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.plan import (
    GroupRead,
    Rows,
    attention_descs,
    consumer_range,
    producer_first_block,
    producer_kept_tokens,
    state_descs,
    transfer_end,
)

FULL = GroupDesc("full_attention", 0, 2, 8)
SLIDING = GroupDesc("sliding_window", 32, 2, 8)


def desc(block_size: int, page: int, bases: tuple[int, ...] = (0, 1 << 20)) -> LayoutDescriptor:
    return LayoutDescriptor("e", "c", block_size, page, bases, (FULL, SLIDING), (), 0, 0)


def rows(plan: Rows) -> list[tuple[int, ...]]:
    return [tuple(r) for r in (plan.tolist() if isinstance(plan, np.ndarray) else plan)]


def test_transfer_end() -> None:
    assert transfer_end(40, 16, has_state=False) == 39
    assert transfer_end(40, 16, has_state=True) == 32
    assert transfer_end(33, 16, has_state=True) == 32  # the boundary <= N - 1
    assert transfer_end(32, 16, has_state=True) == 16
    assert transfer_end(5, 16, has_state=True) == 0  # nothing: the consumer computes it all


def test_sliding_clip_keeps_the_window_plus_one_block() -> None:
    end, b = 100, 16  # the window of token 100 starts at 69 (block 4); one more: block 3
    assert producer_first_block(SLIDING, end, b) == 3
    assert producer_first_block(FULL, end, b) == 0
    # remove_skipped(kept) nulls exactly the blocks before the first kept one
    kept = producer_kept_tokens(end, b)
    assert max(0, kept - SLIDING.window + 1) // b == 3
    assert consumer_range(SLIDING, 0, end, 32, 3 * 16) == (64, 100)  # whole 32-token blocks
    assert consumer_range(FULL, 48, end, 32, 0) == (48, 100)  # after the local hit


def test_equal_block_sizes_merge_runs_into_one_descriptor_per_layer() -> None:
    """Blocks 1,2,3 on both sides, no row padding: K and V of consecutive blocks are one run."""
    local, remote = desc(16, 2 * 16 * 8), desc(16, 2 * 16 * 8, (4096, 8192))
    read = GroupRead(0, 0, 48, [1, 2, 3], [5, 6, 7], 0)
    out = rows(attention_descs(local, remote, read))
    row = 2 * 16 * 8
    assert out == [(row, 4096 + 5 * row, 3 * row), ((1 << 20) + row, 8192 + 5 * row, 3 * row)]


def test_different_block_sizes_map_tokens_onto_each_sides_pages() -> None:
    """P blocks of 16, D blocks of 32: D block 7 takes P blocks 2 and 3 (K then V each)."""
    tb = FULL.token_bytes
    local, remote = desc(32, 2 * 32 * tb, (0, 0)), desc(16, 2 * 16 * tb, (0, 0))
    read = GroupRead(0, 0, 32, [7], [2, 3], 0)
    got = rows(attention_descs(local, remote, read))[:4]  # layer 0
    d_row, p_row = 2 * 32 * tb, 2 * 16 * tb
    assert got == [
        (7 * d_row, 2 * p_row, 16 * tb),  # K tokens 0..15
        (7 * d_row + 32 * tb, 2 * p_row + 16 * tb, 16 * tb),  # V tokens 0..15
        (7 * d_row + 16 * tb, 3 * p_row, 16 * tb),  # K tokens 16..31
        (7 * d_row + 48 * tb, 3 * p_row + 16 * tb, 16 * tb),  # V tokens 16..31
    ]
    assert sum(n for _, _, n in attention_descs(local, remote, read)) == 2 * 32 * 2 * tb


def test_state_reads_each_tensor_of_the_staged_entry() -> None:
    tensors = ((TensorDesc(1000, 64), TensorDesc(5000, 32)),)
    local = LayoutDescriptor("d", "c", 16, 0, (), (), tensors, 0, 0)
    remote = LayoutDescriptor("p", "c", 16, 0, (), (), tensors, 9000, 96)
    # slot 2 on D; staged entry 1 on P: tensors at offsets 0 and 64 inside the entry
    assert state_descs(local, remote, 0, 2, 1) == [(1128, 9096, 64), (5064, 9160, 32)]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"side_channel_port": "x"}, "side_channel_port='x' must be a port number"),
        ({"bogus": 1}, "unknown kv_connector_extra_config keys ['bogus']"),
        ({"abort_timeout_seconds": -1}, "abort_timeout_seconds=-1 must be a positive number"),
    ],
)
def test_bad_options_are_named(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        NixlOptions.parse(extra)


@pytest.mark.parametrize("path", ["short", "long", "short_numpy_rows", "numpy_cuts"])
@pytest.mark.parametrize("runs", ["shuffled", "consecutive"])
@pytest.mark.parametrize(("bl", "br"), [(16, 16), (16, 32), (32, 16)])
@pytest.mark.parametrize(("lo", "hi"), [(0, 64), (5, 64), (17, 90), (40, 41), (3, 600)])
def test_descriptors_move_every_token_once_onto_its_page(
    bl: int, br: int, lo: int, hi: int, path: str, runs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan (each of its ways), expanded token by token, equals the address
    arithmetic written out per token (K and V, every layer), over shuffled tables on both
    sides."""
    monkeypatch.setattr(plan, "SHORT_RUNS", {"long": 0, "numpy_cuts": 3}.get(path, 1000))
    monkeypatch.setattr(plan, "SHORT_ROWS", 0 if path == "short_numpy_rows" else 1000)
    tb = FULL.token_bytes
    local, remote = desc(bl, 2 * bl * tb, (0, 1 << 20)), desc(br, 2 * br * tb, (1 << 24, 1 << 25))
    rng = random.Random(bl * 1000 + br + lo)
    ltable = rng.sample(range(1, 80), -(-hi // bl))
    rtable = rng.sample(range(1, 80), -(-hi // br))
    if runs == "consecutive":  # two runs on each side
        ltable = [k + (5 if k < len(ltable) // 2 else 9) for k in range(len(ltable))]
        rtable = [k + (3 if k < len(rtable) // 3 else 7) for k in range(len(rtable))]
    got = set()
    out = rows(attention_descs(local, remote, GroupRead(0, lo, hi, ltable, rtable, 0)))
    for la, ra, n in out:
        got |= {(la + k, ra + k) for k in range(0, n, tb)}
    assert sum(n for _, _, n in out) == (hi - lo) * 2 * tb * FULL.num_layers  # none twice
    want = set()
    for i in range(FULL.num_layers):
        for t in range(lo, hi):
            for half in (0, 1):
                la = local.backing[i] + ltable[t // bl] * local.layer_page_bytes + (half * bl + t % bl) * tb  # fmt: skip
                ra = remote.backing[i] + rtable[t // br] * remote.layer_page_bytes + (half * br + t % br) * tb  # fmt: skip
                want.add((la, ra))
    assert got == want


@pytest.mark.parametrize("br", [16, 32])
def test_a_null_table_entry_is_named(br: int) -> None:
    tb = FULL.token_bytes
    local, remote = desc(16, 2 * 16 * tb), desc(br, 2 * br * tb)
    n = -(-48 // br)
    remote_ok, remote_null = [4, 5, 6][:n], [4, 0, 6][:n]
    for ltable, rtable, token in (([1, 0, 3], remote_ok, 16), ([1, 2, 3], remote_null, br)):
        with pytest.raises(ValueError, match=f"token {token} of group 0 maps to a null block"):
            attention_descs(local, remote, GroupRead(0, 8, 48, ltable, rtable, 0))

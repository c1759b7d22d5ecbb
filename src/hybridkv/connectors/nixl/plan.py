"""Which tokens and bytes a transfer moves, and the descriptor pairs that move them (pure).

The producer hands over the KV of tokens ``[0, E)`` and, for layouts with state groups, the
state at ``E``; the consumer computes ``[E, N)`` itself (at least the last prompt token, whose
logits give the first output token)::

    E = N - 1                         attention-only layouts
    E = floor((N - 1) / B) * B        layouts with state groups (B: the producer's block size)

Per group only what a step resuming at E reads is sent: full-attention groups every block
before E, sliding-window groups the blocks of the window ending at E plus one (so a consumer
with blocks up to twice as large still gets whole blocks), state groups one checkpoint.
Addresses are computed token by token segment (a segment never crosses a block of either
side), K and V separately, then merged where both sides are contiguous: with equal block sizes
a run of consecutive blocks becomes one descriptor per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybridkv.connectors.nixl.layout import GroupDesc, LayoutDescriptor

Desc = tuple[int, int, int]  # (local address, remote address, bytes)


def transfer_end(num_prompt_tokens: int, block_size: int, has_state: bool) -> int:
    if has_state:
        return (num_prompt_tokens - 1) // block_size * block_size
    return num_prompt_tokens - 1


def producer_first_block(group: GroupDesc, end: int, block_size: int) -> int:
    """The first table entry a producer keeps and sends for ``group``."""
    if not group.window:
        return 0
    return max(0, (max(0, end - group.window + 1) // block_size) - 1)


def producer_kept_tokens(end: int, block_size: int) -> int:
    """The position whose window ``remove_skipped`` keeps = what ``producer_first_block`` keeps."""
    return max(0, end - block_size)


def consumer_range(
    group: GroupDesc, start: int, end: int, block_size: int, remote_first_token: int
) -> tuple[int, int]:
    """Tokens ``[lo, end)`` of ``group`` a consumer reads: after its local hit (``start``),
    inside the window's whole blocks, and where the producer still has data."""
    lo = max(start, remote_first_token)
    if group.window:
        lo = max(lo, max(0, end - group.window + 1) // block_size * block_size)
    return min(lo, end), end


def _segment_starts(lo: int, hi: int, b1: int, b2: int) -> np.ndarray:
    """Starts of the token segments of ``[lo, hi)`` that cross no block of either side."""
    cuts = [np.arange(-(-lo // b) * b, hi, b, dtype=np.int64) for b in (b1, b2)]
    return np.unique(np.concatenate([np.array([lo], dtype=np.int64), *cuts]))


@dataclass(frozen=True, slots=True)
class GroupRead:
    """One attention group's read: tokens [lo, hi); tables of both sides (the remote one
    starts at table index ``remote_first``)."""

    group_index: int  # index into the layout's groups
    lo: int
    hi: int
    local_table: list[int]
    remote_table: list[int]
    remote_first: int


def attention_descs(
    local: LayoutDescriptor, remote: LayoutDescriptor, read: GroupRead
) -> list[Desc]:
    """Per layer, per segment, K then V (so whole consecutive blocks merge into one run)."""
    if read.hi <= read.lo:
        return []
    group = local.groups[read.group_index]
    tb, bl, br = group.token_bytes, local.block_size, remote.block_size
    starts = _segment_starts(read.lo, read.hi, bl, br)
    sizes = (np.append(starts[1:], read.hi) - starts) * tb
    lb = np.asarray(read.local_table, dtype=np.int64)[starts // bl]
    rb = np.asarray(read.remote_table, dtype=np.int64)[starts // br - read.remote_first]
    if not (lb.all() and rb.all()):
        bad = int(starts[np.flatnonzero((lb == 0) | (rb == 0))[0]])
        raise ValueError(f"token {bad} of group {read.group_index} maps to a null block")
    halves = np.arange(2, dtype=np.int64)[:, None]  # K, V
    l_off = lb * local.layer_page_bytes + (halves * bl + starts % bl) * tb  # [2, segments]
    r_off = rb * remote.layer_page_bytes + (halves * br + starts % br) * tb
    layers = range(group.num_layers)
    l_base = np.array([local.backing[i] for i in layers], dtype=np.int64)[:, None, None]
    r_base = np.array([remote.backing[i] for i in layers], dtype=np.int64)[:, None, None]
    la = (l_base + l_off.T[None]).reshape(-1)  # [layers, segments, 2] flattened
    ra = (r_base + r_off.T[None]).reshape(-1)
    n = np.broadcast_to(sizes[None, :, None], (len(l_base), len(starts), 2)).reshape(-1)
    return merge_arrays(la, ra, n)


def merge_arrays(la: np.ndarray, ra: np.ndarray, n: np.ndarray) -> list[Desc]:
    """``merge`` over arrays: runs contiguous on both sides become one descriptor."""
    joined = (la[:-1] + n[:-1] == la[1:]) & (ra[:-1] + n[:-1] == ra[1:])
    first = np.flatnonzero(np.concatenate([[True], ~joined]))
    sums = np.add.reduceat(n, first)
    return list(zip(la[first].tolist(), ra[first].tolist(), sums.tolist(), strict=True))


def state_descs(
    local: LayoutDescriptor, remote: LayoutDescriptor, state_index: int, slot: int, staged: int
) -> list[Desc]:
    """A staged checkpoint of the producer into the consumer's live slot ``slot``."""
    base = remote.staging_base + staged * remote.staging_stride
    offsets = remote.state_offsets(state_index)
    return merge(
        [
            (t.base + slot * t.slot_bytes, base + off, t.slot_bytes)
            for t, off in zip(local.state_tensors[state_index], offsets, strict=True)
        ]
    )


def merge(descs: list[Desc]) -> list[Desc]:
    out: list[Desc] = []
    for la, ra, n in descs:
        if out and out[-1][0] + out[-1][2] == la and out[-1][1] + out[-1][2] == ra:
            pla, pra, pn = out[-1]
            out[-1] = (pla, pra, pn + n)
        else:
            out.append((la, ra, n))
    return out


def expected_bytes(
    groups: tuple[GroupDesc, ...], ranges: list[tuple[int, int]], state_bytes: int
) -> int:
    """Bytes a read of these per-attention-group token ranges plus ``state_bytes`` moves."""
    attn = [g for g in groups if g.token_bytes]
    return state_bytes + sum(
        (hi - lo) * 2 * g.token_bytes * g.num_layers
        for g, (lo, hi) in zip(attn, ranges, strict=True)
    )

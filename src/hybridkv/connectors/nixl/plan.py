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

from collections.abc import Iterator
from dataclasses import dataclass

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


def _segments(lo: int, hi: int, b1: int, b2: int) -> Iterator[tuple[int, int]]:
    t = lo
    while t < hi:
        nxt = min(hi, (t // b1 + 1) * b1, (t // b2 + 1) * b2)
        yield t, nxt
        t = nxt


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
    group = local.groups[read.group_index]
    tb, bl, br = group.token_bytes, local.block_size, remote.block_size
    out: list[Desc] = []
    for i in range(group.num_layers):
        for t0, t1 in _segments(read.lo, read.hi, bl, br):
            lb = read.local_table[t0 // bl]
            rb = read.remote_table[t0 // br - read.remote_first]
            if not (lb and rb):
                raise ValueError(f"token {t0} of group {read.group_index} maps to a null block")
            for half in (0, 1):
                la = local.backing[i] + lb * local.layer_page_bytes + (half * bl + t0 % bl) * tb
                ra = remote.backing[i] + rb * remote.layer_page_bytes + (half * br + t0 % br) * tb
                out.append((la, ra, (t1 - t0) * tb))
    return merge(out)


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

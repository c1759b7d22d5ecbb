"""Which bytes a transfer moves: the descriptor pairs of a consumer's load (pure).

The tokens come from ``spans`` (re-exported here). Addresses are computed token by token
segment (a segment never crosses a block of either side), K and V separately, then merged
where both sides are contiguous inside a layer: with equal block sizes a run of consecutive
blocks becomes one descriptor per layer. A plan is rows (local address, remote address,
bytes), what ``agent.read`` posts: a list when short, an (N, 3) int64 array when long.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybridkv.connectors.nixl.layout import GroupDesc, LayoutDescriptor
from hybridkv.connectors.nixl.meta import RemoteSource
from hybridkv.connectors.nixl.spans import (
    consumer_range,
    first_held,
    first_whole_entries,
    first_whole_entry,
    needed_from,
    producer_first_block,
    producer_kept_tokens,
    transfer_end,
)
from hybridkv.step_io import LoadSpec

Desc = tuple[int, int, int]  # (local address, remote address, bytes)
Rows = list[Desc] | np.ndarray  # a plan; a short one stays a list (numpy costs µs a call)
SHORT_RUNS = 64  # block runs found in plain Python (more: numpy)
SHORT_ROWS = 32  # rows expanded per layer in plain Python (more: numpy)

__all__ = [  # the token arithmetic, from ``spans``
    "consumer_range",
    "first_held",
    "first_whole_entries",
    "first_whole_entry",
    "needed_from",
    "producer_first_block",
    "producer_kept_tokens",
    "transfer_end",
]


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


@dataclass(frozen=True, slots=True)
class _Pages:
    """Both sides' page geometry for one group: bytes per token, block sizes, page strides."""

    tb: int
    bl: int
    br: int
    pl: int
    pr: int


def load_rows(
    local: LayoutDescriptor, remote: LayoutDescriptor, spec: LoadSpec, src: RemoteSource
) -> Rows:
    """Rows (local address, remote address, bytes) of a consumer's load: every attention
    group's read (``consumer_range``) and the staged state. Raises ValueError if the params
    contradict the producer's layout (the load fails and is recomputed)."""
    if src.block_size not in (0, remote.block_size):
        raise ValueError(
            f"remote_block_size {src.block_size} in kv_transfer_params, but the producer's "
            f"handshake says {remote.block_size}"
        )
    parts: list[Rows] = []
    attn = [i for i, g in enumerate(local.groups) if g.token_bytes]
    for j, group_index in enumerate(attn):
        group = local.groups[group_index]
        first = src.first_blocks[j] * remote.block_size
        lo, hi = consumer_range(group, spec.start, spec.end, local.block_size, first)
        stop = -(-hi // remote.block_size) - src.first_blocks[j]  # remote entries read
        if hi > lo and stop > len(src.block_ids[j]):
            raise ValueError(
                f"remote_block_ids of attention group {j} list {len(src.block_ids[j])} "
                f"blocks; reading up to token {hi} needs {stop}"
            )
        table = _table(spec.block_indices[j], spec.block_ids[j])
        read = GroupRead(group_index, lo, hi, table, list(src.block_ids[j]), src.first_blocks[j])
        parts.append(attention_descs(local, remote, read))
    if src.staged_state is not None:
        for s, slot in enumerate(spec.state_slots):
            parts.append(state_descs(local, remote, s, slot, src.staged_state))
    return parts[0] if len(parts) == 1 else join(parts)


def _table(indices: list[int], ids: list[int]) -> list[int]:
    """The local block table (entry k: block id, 0 where nothing is loaded) of a load."""
    if indices and indices == list(range(indices[0], indices[0] + len(indices))):  # one run
        return [0] * indices[0] + list(ids)
    table = [0] * (max(indices, default=-1) + 1)
    for k, block in zip(indices, ids, strict=True):
        table[k] = block
    return table


def attention_descs(local: LayoutDescriptor, remote: LayoutDescriptor, read: GroupRead) -> Rows:
    """Rows (local address, remote address, bytes): per layer, the runs of one layer's pages.

    The runs (page offsets, merged where contiguous on both sides) are the same for every
    layer of the group. With equal block sizes they are found block run by block run in plain
    Python (a numpy call costs about what a whole short plan does); with different block sizes,
    or many runs, token segment by segment with numpy."""
    if read.hi <= read.lo:
        return []
    group = local.groups[read.group_index]
    bl, br = local.block_size, remote.block_size
    pages = _Pages(group.token_bytes, bl, br, local.layer_page_bytes, remote.layer_page_bytes)
    layers = group.num_layers
    runs = _runs_equal(read, pages) if bl == br else None
    if runs is not None and len(runs) * layers <= SHORT_ROWS:
        lb, rb = local.backing, remote.backing
        return [(lb[i] + a, rb[i] + b, n) for i in range(layers) for a, b, n in runs]
    rel = _runs_long(read, pages) if runs is None else np.array(runs, dtype=np.int64)
    out = np.empty((layers, len(rel), 3), dtype=np.int64)
    out[:] = rel
    out[:, :, 0] += np.array(local.backing[:layers], dtype=np.int64)[:, None]
    out[:, :, 1] += np.array(remote.backing[:layers], dtype=np.int64)[:, None]
    return out.reshape(-1, 3)


def join(parts: list[Rows]) -> Rows:
    if all(isinstance(p, list) for p in parts):
        return [row for p in parts for row in p]
    return np.concatenate([np.asarray(p, dtype=np.int64).reshape(-1, 3) for p in parts])


def total_bytes(rows: Rows) -> int:
    return sum(n for _, _, n in rows) if isinstance(rows, list) else int(rows[:, 2].sum())


def _null_block(read: GroupRead, token: int) -> ValueError:
    return ValueError(f"token {token} of group {read.group_index} maps to a null block")


def _runs_equal(read: GroupRead, p: _Pages) -> list[tuple[int, int, int]] | None:
    """One layer's runs (local offset, remote offset, bytes) when both sides' blocks hold the
    same tokens: a run of blocks consecutive on both sides (pages dense: K and V fill the
    page) is one row, except a partial first block's K and a partial last block's V.
    None if there are more than ``SHORT_RUNS`` runs."""
    b, tb, page = p.bl, p.tb, 2 * p.bl * p.tb
    k0, k1 = read.lo // b, (read.hi - 1) // b + 1  # table entries [k0, k1)
    lt = read.local_table[k0:k1]
    rt = read.remote_table[k0 - read.remote_first : k1 - read.remote_first]
    m = k1 - k0
    if len(lt) != m or len(rt) != m or 0 in lt or 0 in rt:
        bad = next(k for k in range(m) if k >= min(len(lt), len(rt)) or not (lt[k] and rt[k]))
        raise _null_block(read, max(read.lo, (k0 + bad) * b))
    if p.pl != page or p.pr != page:
        cuts = list(range(1, m))
    elif lt == list(range(lt[0], lt[0] + m)) and rt == list(range(rt[0], rt[0] + m)):
        cuts = []  # one run on both sides (common: tables come in runs), compared in C
    elif m > SHORT_RUNS:
        steps = np.diff(np.array([lt, rt], dtype=np.int64), axis=1)
        cuts = (np.flatnonzero((steps != 1).any(axis=0)) + 1).tolist()
    else:
        cuts = [i for i in range(1, m) if lt[i] - lt[i - 1] != 1 or rt[i] - rt[i - 1] != 1]
    if len(cuts) >= SHORT_RUNS:
        return None
    runs: list[tuple[int, int, int]] = []
    bounds = [0, *cuts, m]
    for first, stop in zip(bounds[:-1], bounds[1:], strict=True):  # blocks [first, stop)
        s = max(read.lo - (k0 + first) * b, 0)  # tokens skipped in the first block
        e = min(read.hi - (k0 + stop - 1) * b, b)  # tokens used in the last block
        la, ra = lt[first] * p.pl, rt[first] * p.pr
        lz, rz = lt[stop - 1] * p.pl, rt[stop - 1] * p.pr
        if s == 0 and e == b:
            runs.append((la, ra, lz - la + page))
        elif stop - first == 1:  # one partial block: K and V apart
            runs.append((la + s * tb, ra + s * tb, (e - s) * tb))
            runs.append((la + (b + s) * tb, ra + (b + s) * tb, (e - s) * tb))
        else:
            if s:
                runs.append((la + s * tb, ra + s * tb, (b - s) * tb))
                la, ra = la + (b + s) * tb, ra + (b + s) * tb
            end = lz + (e * tb if e < b else page)
            runs.append((la, ra, end - la))
            if e < b:
                runs.append((lz + b * tb, rz + b * tb, e * tb))
    return runs


def _runs_long(read: GroupRead, p: _Pages) -> np.ndarray:
    """``_runs_short`` over arrays: one row per run, columns local/remote offset, bytes."""
    starts = _segment_starts(read.lo, read.hi, p.bl, p.br)
    sizes = (np.append(starts[1:], read.hi) - starts) * p.tb
    lb = np.asarray(read.local_table, dtype=np.int64)[starts // p.bl]
    rb = np.asarray(read.remote_table, dtype=np.int64)[starts // p.br - read.remote_first]
    if not (lb.all() and rb.all()):
        raise _null_block(read, int(starts[np.flatnonzero((lb == 0) | (rb == 0))[0]]))
    halves = np.arange(2, dtype=np.int64)  # K, V
    la = (lb * p.pl + p.tb * (starts % p.bl))[:, None] + halves * (p.bl * p.tb)
    ra = (rb * p.pr + p.tb * (starts % p.br))[:, None] + halves * (p.br * p.tb)
    return merge_arrays(la.reshape(-1), ra.reshape(-1), np.repeat(sizes, 2))


def merge_arrays(la: np.ndarray, ra: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Runs contiguous on both sides become one row (local, remote, bytes)."""
    joined = (la[:-1] + n[:-1] == la[1:]) & (ra[:-1] + n[:-1] == ra[1:])
    first = np.flatnonzero(np.concatenate([[True], ~joined]))
    return np.stack([la[first], ra[first], np.add.reduceat(n, first)], axis=1)


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

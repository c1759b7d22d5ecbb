"""Turn a ``SchedulerOutput`` into the tensors of one forward pass (built once per step).

Attention metadata is built per attention group; decode requests (one query) and the rest
form separate sub-batches so a long prefill does not pad every decode row to its length.
With the native kernels (``hybridkv.native.attention``, the default where they build) an
attention group needs only its block table and each token's row and position: no sub-batches,
masks or gathers. The pure-torch path (``attn_meta_torch.py``) gathers keys by whole blocks
starting at the first block a request's window needs::

    full:     blocks [0, cdiv(ctx, B))
    sliding:  blocks [(start - W + 1) // B, cdiv(ctx, B))   (earlier entries are null)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch

from hybridkv.kv.spec import KVCacheLayout, SlidingWindowSpec, StateSpec
from hybridkv.model.layers.step_context import (
    AttnMeta,
    KernelAttnMeta,
    StateMeta,
    StateTaps,
    StepContext,
)
from hybridkv.model.step import attn_meta_torch
from hybridkv.model.step.attn_meta_torch import SubBatchShape
from hybridkv.model.step.request_tensors import RequestTensors, request_tensors
from hybridkv.native.attention import AttentionKernels, KernelTable, load_attention
from hybridkv.step_io import ScheduledRequest, StateCopy


@dataclass(frozen=True, slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T]
    ctx: StepContext
    sample_token_idx: torch.Tensor  # [S] last token of each request that samples


def build_step(
    requests: list[ScheduledRequest],
    layout: KVCacheLayout,
    kv_pages: dict[int, torch.Tensor],
    states: dict[int, tuple[torch.Tensor, ...]],
    saves: Sequence[StateCopy] = (),
    kernels: AttentionKernels | None | Literal["auto"] = "auto",
) -> StepInputs:
    """``saves`` with ``at`` set become the state groups' taps (states from inside the scan);
    the others are the runner's copies after the forward and are ignored here. ``kernels``:
    the native attention kernels, None for the pure-torch path, ``"auto"`` for the kernels
    where they could be built."""
    if kernels == "auto":
        kernels = load_attention()
    reqs = request_tensors(requests)
    num_tokens = reqs.tok_req.shape[0]
    input_ids = np.fromiter(
        chain.from_iterable(r.token_ids for r in requests), dtype=np.int64, count=num_tokens
    )
    ctx = StepContext(
        positions=reqs.positions,
        max_position=reqs.max_position,
        kv_pages=kv_pages,
        attn_meta=_attn_meta(requests, layout, kv_pages, reqs, kernels),
        states=states,
        state_meta=_state_meta_by_layer(requests, layout, reqs, saves),
    )
    return StepInputs(torch.from_numpy(input_ids), ctx, reqs.sample_token_idx)


def _attn_meta(
    requests: list[ScheduledRequest],
    layout: KVCacheLayout,
    kv_pages: dict[int, torch.Tensor],
    reqs: RequestTensors,
    kernels: AttentionKernels | None,
) -> dict[int, AttnMeta | KernelAttnMeta]:
    """Layer id -> its attention group's metadata: the kernels' tables, or the torch path's
    sub-batches (masks shared by the groups of one window)."""
    out: dict[int, AttnMeta | KernelAttnMeta] = {}
    tables = _kernel_tables(requests, layout, kv_pages, reqs) if kernels is not None else {}
    mask_cache: dict[int | None, dict[str, SubBatchShape]] = {}
    for group in layout.groups:
        if isinstance(group.spec, StateSpec):
            continue
        meta: AttnMeta | KernelAttnMeta
        if kernels is not None:
            meta = KernelAttnMeta(tables[group.group_id], kernels)
        else:
            window = (
                group.spec.sliding_window if isinstance(group.spec, SlidingWindowSpec) else None
            )
            table = torch.from_numpy(
                _pad_tables([r.block_ids[group.group_id] for r in requests])[0]
            )
            masks = mask_cache.setdefault(window, {})
            meta = attn_meta_torch.attn_meta(reqs, table, group.spec.block_size, window, masks)
        out.update(dict.fromkeys(group.layer_ids, meta))
    return out


def _state_meta_by_layer(
    requests: list[ScheduledRequest],
    layout: KVCacheLayout,
    reqs: RequestTensors,
    saves: Sequence[StateCopy],
) -> dict[int, StateMeta]:
    """Layer id -> its state group's metadata (the requests' live slots, the group's taps)."""
    out: dict[int, StateMeta] = {}
    state_groups = [g for g in layout.groups if isinstance(g.spec, StateSpec)]
    for state_index, group in enumerate(state_groups):
        slot_ids = [r.state_slots[state_index] for r in requests]
        slots = torch.tensor(slot_ids, dtype=torch.long)
        group_saves = [s for s in saves if s.group_id == group.group_id]
        taps = _taps(requests, reqs, state_index, group_saves)
        if taps is None and reqs.prefill_rows.numel() == 0:
            meta = _decode_state_meta(reqs, slots, _as_run(slot_ids))
        else:
            meta = _state_meta(reqs, slots, taps)
        out.update(dict.fromkeys(group.layer_ids, meta))
    return out


def _pad_tables(tables: list[list[int]]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Ragged block tables -> (``[len(tables), max(1, max_len)]`` padded with the null block
    0, every entry flat)."""
    lens = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
    flat = np.fromiter(chain.from_iterable(tables), dtype=np.int64, count=int(lens.sum()))
    out = np.zeros((len(tables), max(1, int(lens.max()))), dtype=np.int64)
    out[np.arange(out.shape[1])[None, :] < lens[:, None]] = flat
    return out, flat


def _kernel_tables(
    requests: list[ScheduledRequest],
    layout: KVCacheLayout,
    kv_pages: dict[int, torch.Tensor],
    reqs: RequestTensors,
) -> dict[int, KernelTable]:
    """Every attention group's ``KernelTable`` from one ``[G, R, nb]`` array, checked once
    (``KernelTable.checked``'s rules over all groups): every entry a block of the pages,
    every token's row and position inside the tables."""
    groups = [g for g in layout.groups if not isinstance(g.spec, StateSpec)]
    if not groups:
        return {}
    tables = [r.block_ids[g.group_id] for g in groups for r in requests]  # group-major
    out, flat = _pad_tables(tables)
    width = out.shape[1]
    num_blocks = min(int(kv_pages[g.layer_ids[0]].shape[0]) for g in groups)
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= num_blocks):
        raise IndexError(f"block id out of range [0, {num_blocks})")
    positions = reqs.positions_np
    # rows come from request_tensors: [0, R) by construction
    if positions.size and (
        int(positions.min()) < 0 or int(positions.max()) >= width * layout.block_size
    ):
        raise IndexError("token position past its block table")
    stacked = torch.from_numpy(out.reshape(len(groups), len(requests), width))
    return {
        g.group_id: KernelTable(
            stacked[i],
            reqs.tok_req,
            reqs.positions,
            g.spec.sliding_window if isinstance(g.spec, SlidingWindowSpec) else 0,
        )
        for i, g in enumerate(groups)
    }


def _taps(
    requests: list[ScheduledRequest],
    reqs: RequestTensors,
    state_index: int,
    saves: list[StateCopy],
) -> StateTaps | None:
    """The group's mid-step saves as (prefill row, tokens into the row, destination slot)."""
    inside = [s for s in saves if s.at is not None]
    if not inside:
        return None
    by_slot = {r.state_slots[state_index]: i for i, r in enumerate(requests)}
    row_of_req = {int(r): k for k, r in enumerate(reqs.prefill_rows)}
    rows, lens, slots = [], [], []
    for s in inside:
        i = by_slot.get(s.src_slot)
        assert s.at is not None
        n = s.at - requests[i].start_pos if i is not None else 0
        if i is None or i not in row_of_req or not 0 < n < len(requests[i].token_ids):
            raise ValueError(
                f"state save at token {s.at} of live slot {s.src_slot} (group {s.group_id}) is "
                "not strictly inside a scheduled prefill"
            )
        rows.append(row_of_req[i])
        lens.append(n)
        slots.append(s.dst_slot)
    return StateTaps(*(torch.tensor(v, dtype=torch.long) for v in (rows, lens, slots)))


def _state_meta(
    reqs: RequestTensors, slots: torch.Tensor, taps: StateTaps | None = None
) -> StateMeta:
    rows = reqs.prefill_rows
    lens = reqs.lens[rows]
    width = int(lens.max()) if rows.numel() else 0
    steps = torch.arange(width)
    valid = steps[None, :] < lens[:, None]  # [Rp, L]
    gather = torch.where(valid, reqs.cu_starts[rows][:, None] + steps, 0)  # [Rp, L]
    decode_slots = slots[reqs.decode_rows]
    return StateMeta(
        decode_token_idx=reqs.cu_starts[reqs.decode_rows],
        decode_slots=decode_slots,
        decode_slot_run=_as_run(decode_slots.tolist()),
        prefill_gather=gather,
        prefill_valid=valid,
        prefill_lens=lens,
        prefill_slots=slots[rows],
        prefill_token_idx=gather[valid],
        taps=taps,
    )


# a decode step's empty prefill fields: nobody writes into a tensor with no elements
_NO_ROWS = torch.zeros(0, dtype=torch.long)
_NO_GATHER = torch.zeros(0, 0, dtype=torch.long)
_NO_VALID = torch.zeros(0, 0, dtype=torch.bool)


def _decode_state_meta(
    reqs: RequestTensors, slots: torch.Tensor, slot_run: slice | None
) -> StateMeta:
    """``_state_meta`` of a step where every request decodes one token (``slots``: one per
    request, in order) and no save is due inside the step: no prefill indexing to build."""
    return StateMeta(
        decode_token_idx=reqs.cu_starts,  # every row decodes: token i is request i's
        decode_slots=slots,
        decode_slot_run=slot_run,
        prefill_gather=_NO_GATHER,
        prefill_valid=_NO_VALID,
        prefill_lens=_NO_ROWS,
        prefill_slots=_NO_ROWS,
        prefill_token_idx=_NO_ROWS,
    )


def _as_run(slots: list[int]) -> slice | None:
    """``slice(a, a + n)`` when ``slots`` is exactly ``a, a + 1, ..., a + n - 1``."""
    if not slots:
        return None
    first = slots[0]
    if slots != list(range(first, first + len(slots))):
        return None
    return slice(first, first + len(slots))

"""Turn a ``SchedulerOutput`` into the tensors of one forward pass (built once per step).

Attention metadata is built per attention group; decode requests (one query) and the rest
form separate sub-batches so a long prefill does not pad every decode row to its length.
Keys are gathered by whole blocks starting at the first block a request's window needs::

    full:     blocks [0, cdiv(ctx, B))
    sliding:  blocks [(start - W + 1) // B, cdiv(ctx, B))   (earlier entries are null)
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import torch

from hybridkv.kv.spec import KVCacheLayout, SlidingWindowSpec, StateSpec
from hybridkv.model.step_context import AttnMeta, AttnSubBatch, StateMeta, StepContext
from hybridkv.sched.output import ScheduledRequest


@dataclass(frozen=True, slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [T]
    ctx: StepContext
    sample_token_idx: torch.Tensor  # [S] last token of each request that samples


@dataclass(frozen=True, slots=True)
class _Requests:
    """Request-level tensors shared by every group's metadata."""

    starts: torch.Tensor  # [R]
    lens: torch.Tensor  # [R]
    cu_starts: torch.Tensor  # [R] flat index of each request's first token
    tok_req: torch.Tensor  # [T]
    tok_off: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    decode_rows: torch.Tensor  # [Rd] requests with one token
    prefill_rows: torch.Tensor  # [Rp] the others


def build_step(
    requests: list[ScheduledRequest],
    layout: KVCacheLayout,
    kv_pages: dict[int, torch.Tensor],
    states: dict[int, tuple[torch.Tensor, ...]],
) -> StepInputs:
    reqs = _request_tensors(requests)
    attn_meta: dict[int, AttnMeta] = {}
    state_meta: dict[int, StateMeta] = {}
    mask_cache: dict[int | None, dict[str, tuple[torch.Tensor, ...]]] = {}
    state_index = 0
    for group in layout.groups:
        if isinstance(group.spec, StateSpec):
            slots = torch.tensor([r.state_slots[state_index] for r in requests], dtype=torch.long)
            meta_s = _state_meta(reqs, slots)
            state_meta.update(dict.fromkeys(group.layer_ids, meta_s))
            state_index += 1
            continue
        window = group.spec.sliding_window if isinstance(group.spec, SlidingWindowSpec) else None
        table = _block_table([r.block_ids[group.group_id] for r in requests])
        masks = mask_cache.setdefault(window, {})
        meta_a = _attn_meta(reqs, table, group.spec.block_size, window, masks)
        attn_meta.update(dict.fromkeys(group.layer_ids, meta_a))
    input_ids = torch.tensor(
        list(chain.from_iterable(r.token_ids for r in requests)), dtype=torch.long
    )
    sample_rows = torch.tensor([i for i, r in enumerate(requests) if r.sample], dtype=torch.long)
    ctx = StepContext(
        positions=reqs.positions,
        max_position=int((reqs.starts + reqs.lens).max()) - 1,
        kv_pages=kv_pages,
        attn_meta=attn_meta,
        states=states,
        state_meta=state_meta,
    )
    return StepInputs(input_ids, ctx, reqs.cu_starts[sample_rows] + reqs.lens[sample_rows] - 1)


def _request_tensors(requests: list[ScheduledRequest]) -> _Requests:
    lens = torch.tensor([len(r.token_ids) for r in requests], dtype=torch.long)
    if bool((lens == 0).any()):
        raise ValueError("a scheduled request has no tokens to compute")
    starts = torch.tensor([r.start_pos for r in requests], dtype=torch.long)
    cu_starts = torch.cumsum(lens, 0) - lens
    tok_req = torch.repeat_interleave(torch.arange(len(requests)), lens)  # [T]
    tok_off = torch.arange(int(lens.sum())) - cu_starts[tok_req]  # [T]
    is_decode = lens == 1
    return _Requests(
        starts=starts,
        lens=lens,
        cu_starts=cu_starts,
        tok_req=tok_req,
        tok_off=tok_off,
        positions=starts[tok_req] + tok_off,
        decode_rows=torch.nonzero(is_decode).flatten(),
        prefill_rows=torch.nonzero(~is_decode).flatten(),
    )


def _block_table(tables: list[list[int]]) -> torch.Tensor:
    """Ragged block tables -> ``[R, max_len]`` padded with the null block 0."""
    lens = torch.tensor([len(t) for t in tables], dtype=torch.long)
    flat = torch.tensor(list(chain.from_iterable(tables)), dtype=torch.long)
    out = torch.zeros(len(tables), max(1, int(lens.max())), dtype=torch.long)
    out[torch.arange(out.shape[1])[None, :] < lens[:, None]] = flat
    return out


def _attn_meta(
    reqs: _Requests,
    table: torch.Tensor,
    block_size: int,
    window: int | None,
    masks: dict[str, tuple[torch.Tensor, ...]],
) -> AttnMeta:
    pos_block = reqs.positions // block_size
    write_blocks = table[reqs.tok_req, pos_block]  # [T]
    subs = []
    for name, rows in (("decode", reqs.decode_rows), ("prefill", reqs.prefill_rows)):
        if rows.numel():
            if name not in masks:
                masks[name] = _sub_batch_shape(reqs, rows, block_size, window)
            subs.append(_sub_batch(reqs, rows, table, masks[name]))
    return AttnMeta(write_blocks, reqs.positions % block_size, tuple(subs))


def _sub_batch_shape(
    reqs: _Requests, rows: torch.Tensor, block_size: int, window: int | None
) -> tuple[torch.Tensor, ...]:
    """What does not depend on the block table: first block, block count, mask, token rows."""
    starts, lens = reqs.starts[rows], reqs.lens[rows]
    ctx_lens = starts + lens
    first_block = torch.zeros_like(starts)
    if window is not None:
        first_block = (starts - window + 1).clamp(min=0) // block_size
    num_blocks = int(((ctx_lens + block_size - 1) // block_size - first_block).max())
    num_queries = int(lens.max())
    key_pos = first_block[:, None] * block_size + torch.arange(num_blocks * block_size)  # [R, K]
    q_pos = torch.minimum(starts[:, None] + torch.arange(num_queries), ctx_lens[:, None] - 1)
    mask = key_pos[:, None, :] <= q_pos[:, :, None]  # [R, Q, K]
    if window is not None:
        mask &= key_pos[:, None, :] > q_pos[:, :, None] - window
    in_rows = torch.isin(reqs.tok_req, rows)
    row_of_req = torch.full((reqs.lens.shape[0],), -1, dtype=torch.long)
    row_of_req[rows] = torch.arange(rows.shape[0])
    token_idx = torch.nonzero(in_rows).flatten()  # [Tb]
    token_rows = row_of_req[reqs.tok_req[token_idx]]
    return first_block, torch.tensor(num_blocks), mask[:, None], token_idx, token_rows


def _sub_batch(
    reqs: _Requests, rows: torch.Tensor, table: torch.Tensor, shape: tuple[torch.Tensor, ...]
) -> AttnSubBatch:
    first_block, num_blocks, mask, token_idx, token_rows = shape
    cols = first_block[:, None] + torch.arange(int(num_blocks))  # [R, nb]
    cols = cols.clamp(max=table.shape[1] - 1)  # past the table: masked out anyway
    return AttnSubBatch(
        token_idx=token_idx,
        rows=token_rows,
        cols=reqs.tok_off[token_idx],
        block_table=table[rows[:, None], cols],
        mask=mask,
        num_queries=int(mask.shape[2]),
    )


def _state_meta(reqs: _Requests, slots: torch.Tensor) -> StateMeta:
    rows = reqs.prefill_rows
    lens = reqs.lens[rows]
    width = int(lens.max()) if rows.numel() else 0
    steps = torch.arange(width)
    valid = steps[None, :] < lens[:, None]  # [Rp, L]
    gather = torch.where(valid, reqs.cu_starts[rows][:, None] + steps, 0)  # [Rp, L]
    return StateMeta(
        decode_token_idx=reqs.cu_starts[reqs.decode_rows],
        decode_slots=slots[reqs.decode_rows],
        prefill_gather=gather,
        prefill_valid=valid,
        prefill_lens=lens,
        prefill_slots=slots[rows],
        prefill_token_idx=gather[valid],
    )

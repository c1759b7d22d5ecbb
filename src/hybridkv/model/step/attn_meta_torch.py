"""Attention metadata for the pure-torch path (no native kernels): per attention group,
decode requests (one query) and the rest form separate sub-batches, each gathering its keys by
whole blocks from the first block its window needs, with masks where not plainly causal.
Built by ``step_builder.build_step`` when the kernels are off; the kernels' test reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridkv.model.layers.step_context import AttnMeta, AttnSubBatch
from hybridkv.model.step.request_tensors import RequestTensors


@dataclass(frozen=True, slots=True)
class SubBatchShape:
    """What does not depend on the block table (shared by groups with the same window)."""

    first_block: torch.Tensor  # [R] first table entry to read
    num_blocks: int  # nb
    mask: torch.Tensor | None  # [R, 1, Q, nb * B]; None when causal
    hidden_keys: torch.Tensor  # [R or 1, 1, nb * B, 1]
    token_idx: torch.Tensor  # [Tb]
    token_rows: torch.Tensor  # [Tb]
    num_queries: int  # Q
    dense: bool
    causal: bool


def attn_meta(
    reqs: RequestTensors,
    table: torch.Tensor,
    block_size: int,
    window: int | None,
    masks: dict[str, SubBatchShape],
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
    reqs: RequestTensors, rows: torch.Tensor, block_size: int, window: int | None
) -> SubBatchShape:
    starts, lens = reqs.starts[rows], reqs.lens[rows]
    ctx_lens = starts + lens
    first_block = torch.zeros_like(starts)
    if window is not None:
        first_block = (starts - window + 1).clamp(min=0) // block_size
    num_blocks = int(((ctx_lens + block_size - 1) // block_size - first_block).max())
    num_queries = int(lens.max())
    # every token of the step, in order, as [R, Q]: no scatter into a padded batch
    dense = rows.shape[0] == reqs.lens.shape[0] and int(lens.min()) == num_queries
    no_window = window is None or window >= num_queries
    causal = dense and no_window and not bool(starts.any())
    num_keys = num_blocks * block_size
    mask = None
    if causal:  # every row sees keys [0, Q)
        hidden_keys = (torch.arange(num_keys) >= num_queries)[None, None, :, None]
    else:
        mask = _mask(starts, ctx_lens, first_block * block_size, num_keys, num_queries, window)
        hidden_keys = ~mask.any(dim=2)[..., None]
    row_of_req = torch.full((reqs.lens.shape[0],), -1, dtype=torch.long)
    row_of_req[rows] = torch.arange(rows.shape[0])
    row_of_token = row_of_req[reqs.tok_req]  # [T], -1 outside the sub-batch
    token_idx = torch.nonzero(row_of_token >= 0).flatten()  # [Tb]
    token_rows = row_of_token[token_idx]
    return SubBatchShape(
        first_block,
        num_blocks,
        mask,
        hidden_keys,
        token_idx,
        token_rows,
        num_queries,
        dense,
        causal,
    )


def _mask(
    starts: torch.Tensor,
    ctx_lens: torch.Tensor,
    first_key: torch.Tensor,
    num_keys: int,
    num_queries: int,
    window: int | None,
) -> torch.Tensor:
    """``[R, 1, Q, K]``: query i of row r sees key positions in its (windowed) causal past."""
    key_pos = first_key[:, None] + torch.arange(num_keys)  # [R, K]
    q_pos = torch.minimum(starts[:, None] + torch.arange(num_queries), ctx_lens[:, None] - 1)
    mask = key_pos[:, None, :] <= q_pos[:, :, None]  # [R, Q, K]
    if window is not None:
        mask &= key_pos[:, None, :] > q_pos[:, :, None] - window
    return mask[:, None]


def _sub_batch(
    reqs: RequestTensors, rows: torch.Tensor, table: torch.Tensor, shape: SubBatchShape
) -> AttnSubBatch:
    cols = shape.first_block[:, None] + torch.arange(shape.num_blocks)  # [R, nb]
    cols = cols.clamp(max=table.shape[1] - 1)  # past the table: masked out anyway
    return AttnSubBatch(
        token_idx=shape.token_idx,
        rows=shape.token_rows,
        cols=reqs.tok_off[shape.token_idx],
        block_table=table[rows[:, None], cols],
        mask=shape.mask,
        hidden_keys=shape.hidden_keys,
        num_queries=shape.num_queries,
        dense=shape.dense,
        causal=shape.causal,
    )

"""Paged attention: write this step's K/V into the pages, then attend over each request's
context. Two paths, chosen per step by the step builder:

- native kernels (``hybridkv.native.attention``): K/V read in place through the block table;
- pure torch (the fallback and the kernels' reference): the context gathered block by block
  into a padded batch, one SDPA call per sub-batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.layers.step_context import AttnSubBatch, KernelAttnMeta, StepContext


class PagedAttention(nn.Module):
    def __init__(
        self,
        layer_id: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.softcap = softcap
        self.compute_dtype: torch.dtype | None = None  # None: the queries' dtype (see matmul.py)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ctx: StepContext,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q ``[T, heads, d]``, k/v ``[T, kv_heads, d]`` -> ``[T, heads * d]``. ``sinks``
        ``[heads]`` (gpt-oss): one more logit per head in every softmax, attending nothing."""
        pages = ctx.kv_pages[self.layer_id]  # [N, 2, B, kv_heads, d]
        meta = ctx.attn_meta[self.layer_id]
        if isinstance(meta, KernelAttnMeta):
            out = meta.kernels.forward(q, k, v, pages, meta.table, self.scale, self.softcap, sinks)
            return (out if q.dtype == torch.float32 else out.to(q.dtype)).flatten(1)
        # NOTE: write through the K and V views: ``pages[blocks, 0, offsets] = k`` (an integer
        # between two index tensors) takes a slow index_put path, milliseconds per call.
        pages[:, 0][meta.write_blocks, meta.write_offsets] = k.to(pages.dtype)
        pages[:, 1][meta.write_blocks, meta.write_offsets] = v.to(pages.dtype)
        subs = meta.sub_batches
        if len(subs) == 1 and subs[0].dense:  # all prefill or all decode: no scatter
            return self._attend(q, pages, subs[0], sinks).flatten(1)
        out = q.new_empty(q.shape)  # [T, heads, d]
        for sub in subs:
            out[sub.token_idx] = self._attend(q, pages, sub, sinks)
        return out.flatten(1)

    def _attend(
        self, q: torch.Tensor, pages: torch.Tensor, sub: AttnSubBatch, sinks: torch.Tensor | None
    ) -> torch.Tensor:
        """Queries of one sub-batch -> their outputs ``[Tb, heads, d]``, in ``token_idx`` order."""
        dtype = self.compute_dtype or q.dtype
        q_pad = self._pad_queries(q, sub).to(dtype)  # [R, heads, Q, d]
        k_ctx = _gather(pages[:, 0], sub.block_table).to(dtype)  # [R, kv_heads, K, d]
        v_ctx = _gather(pages[:, 1], sub.block_table).to(dtype)  # [R, kv_heads, K, d]
        # NOTE: key slots no query may attend still come from whole blocks; a reused block can
        # hold anything there (a failed load's bytes: NaN, inf). Masking alone lets NaN through
        # (NaN + -inf, 0 * NaN), so those slots are zeroed.
        k_ctx.masked_fill_(sub.hidden_keys, 0.0)
        v_ctx.masked_fill_(sub.hidden_keys, 0.0)
        if self.softcap is None and sinks is None:
            out = F.scaled_dot_product_attention(
                q_pad,
                k_ctx,
                v_ctx,
                attn_mask=sub.mask,
                is_causal=sub.causal,
                scale=self.scale,
                enable_gqa=True,
            )  # [R, heads, Q, d]
        else:
            out = self._explicit(q_pad, k_ctx, v_ctx, _mask_of(sub, k_ctx.shape[2]), sinks)
        out = out.transpose(1, 2).to(q.dtype)  # [R, Q, heads, d]
        if sub.dense:
            return out.reshape(-1, self.num_heads, self.head_dim)
        return out[sub.rows, sub.cols]

    def _pad_queries(self, q: torch.Tensor, sub: AttnSubBatch) -> torch.Tensor:
        """``[T, heads, d]`` -> the sub-batch's queries ``[R, heads, Q, d]`` (zero padded)."""
        num_rows = sub.block_table.shape[0]
        if sub.dense:
            return q.view(num_rows, sub.num_queries, self.num_heads, self.head_dim).transpose(1, 2)
        if sub.num_queries == 1:
            return q[sub.token_idx][:, :, None, :]  # rows == token order
        q_pad = q.new_zeros(num_rows, sub.num_queries, self.num_heads, self.head_dim)
        q_pad[sub.rows, sub.cols] = q[sub.token_idx]
        return q_pad.transpose(1, 2)

    def _explicit(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor,
        sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        """Scores written out: logit soft-capping and/or attention sinks."""
        groups = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(groups, dim=1)  # [R, heads, K, d]
        v = v.repeat_interleave(groups, dim=1)  # [R, heads, K, d]
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale  # [R, heads, Q, K]
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        scores = scores.masked_fill(~mask, float("-inf"))
        if sinks is not None:
            sink = sinks.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:3], 1)
            scores = torch.cat([scores, sink], dim=-1)  # [R, heads, Q, K + 1]
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        if sinks is not None:
            probs = probs[..., :-1]
        return torch.matmul(probs, v)  # [R, heads, Q, d]


def _mask_of(sub: AttnSubBatch, num_keys: int) -> torch.Tensor:
    if sub.mask is not None:
        return sub.mask
    causal = torch.ones(sub.num_queries, num_keys, dtype=torch.bool).tril()  # [Q, K]
    return causal[None, None]


def _gather(half_pages: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """``[N, B, kv_heads, d]`` pages, ``[R, nb]`` table -> ``[R, kv_heads, nb * B, d]``."""
    rows = half_pages[block_table]  # [R, nb, B, kv_heads, d]
    return rows.flatten(1, 2).transpose(1, 2)

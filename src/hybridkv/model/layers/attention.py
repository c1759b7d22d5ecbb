"""Paged attention: write this step's K/V into the pages, then attend over each request's
context gathered block by block into a padded batch (one SDPA call per sub-batch)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.step_context import AttnSubBatch, StepContext


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

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: StepContext
    ) -> torch.Tensor:
        """q ``[T, heads, d]``, k/v ``[T, kv_heads, d]`` -> ``[T, heads * d]``."""
        pages = ctx.kv_pages[self.layer_id]  # [N, 2, B, kv_heads, d]
        meta = ctx.attn_meta[self.layer_id]
        pages[meta.write_blocks, 0, meta.write_offsets] = k.to(pages.dtype)
        pages[meta.write_blocks, 1, meta.write_offsets] = v.to(pages.dtype)
        out = q.new_empty(q.shape)  # [T, heads, d]
        for sub in meta.sub_batches:
            out[sub.token_idx] = self._attend(q, pages, sub)
        return out.flatten(1)

    def _attend(self, q: torch.Tensor, pages: torch.Tensor, sub: AttnSubBatch) -> torch.Tensor:
        num_rows = sub.block_table.shape[0]
        if sub.num_queries == 1:
            q_pad = q[sub.token_idx][:, :, None, :]  # [R, heads, 1, d] (rows == token order)
        else:
            q_pad = q.new_zeros(num_rows, sub.num_queries, self.num_heads, self.head_dim)
            q_pad[sub.rows, sub.cols] = q[sub.token_idx]
            q_pad = q_pad.transpose(1, 2)  # [R, heads, Q, d]
        k_ctx = _gather(pages[:, 0], sub.block_table).to(q.dtype)  # [R, kv_heads, K, d]
        v_ctx = _gather(pages[:, 1], sub.block_table).to(q.dtype)  # [R, kv_heads, K, d]
        if self.softcap is None:
            out = F.scaled_dot_product_attention(
                q_pad, k_ctx, v_ctx, attn_mask=sub.mask, scale=self.scale, enable_gqa=True
            )  # [R, heads, Q, d]
        else:
            out = self._softcapped(q_pad, k_ctx, v_ctx, sub.mask)
        return out.transpose(1, 2)[sub.rows, sub.cols]  # [Tb, heads, d]

    def _softcapped(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        assert self.softcap is not None
        groups = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(groups, dim=1)  # [R, heads, K, d]
        v = v.repeat_interleave(groups, dim=1)  # [R, heads, K, d]
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale  # [R, heads, Q, K]
        scores = torch.tanh(scores / self.softcap) * self.softcap
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v)  # [R, heads, Q, d]


def _gather(half_pages: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """``[N, B, kv_heads, d]`` pages, ``[R, nb]`` table -> ``[R, kv_heads, nb * B, d]``."""
    rows = half_pages[block_table]  # [R, nb, B, kv_heads, d]
    return rows.flatten(1, 2).transpose(1, 2)

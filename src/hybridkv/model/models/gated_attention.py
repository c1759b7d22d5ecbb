"""Qwen3-Next / Qwen3.5 full attention: ``q_proj`` yields each head's query and an output
gate side by side (``[q_h, gate_h]`` per head); (1 + w) q/k norms, (partial) RoPE, paged
attention, then ``o_proj(out * sigmoid(gate))``."""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.model.config.model_config import ModelConfig
from hybridkv.model.layers.attention import PagedAttention
from hybridkv.model.layers.fused import FusedLinear
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.norm import OffsetRMSNorm
from hybridkv.model.layers.rotary import RotaryCosSin
from hybridkv.model.layers.step_context import StepContext
from hybridkv.model.models.common import _JointQKNorm


class GatedSelfAttention(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelConfig) -> None:
        super().__init__()
        heads, kv_heads, d = cfg.num_attention_heads, cfg.num_kv_heads, cfg.head_dim
        bias = bool(cfg.raw.get("attention_bias", False))
        self.q_proj = Linear(cfg.hidden_size, 2 * heads * d, bias=bias)
        self.k_proj = Linear(cfg.hidden_size, kv_heads * d, bias=bias)
        self.v_proj = Linear(cfg.hidden_size, kv_heads * d, bias=bias)
        self.o_proj = Linear(heads * d, cfg.hidden_size, bias=bias)
        self.qkv = FusedLinear([self.q_proj, self.k_proj, self.v_proj])
        self.q_norm = OffsetRMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = _JointQKNorm(self.q_norm, self.k_norm, heads, kv_heads)
        self.num_heads, self.head_dim = heads, d
        self.attn = PagedAttention(layer_id, heads, kv_heads, d, d**-0.5)

    def forward(self, x: torch.Tensor, rope: RotaryCosSin, ctx: StepContext) -> torch.Tensor:
        n, heads, d = x.shape[0], self.num_heads, self.head_dim
        qkv = self.qkv(x).view(n, -1, d)  # [T, 2 * heads + 2 * kv_heads, d]
        q_gate = qkv[:, : 2 * heads].view(n, heads, 2, d)
        q, gate = q_gate[:, :, 0], q_gate[:, :, 1]  # [T, heads, d]
        k, v = qkv[:, 2 * heads :].chunk(2, dim=1)  # [T, kv_heads, d]
        qk = rope.apply(self.qk_norm(torch.cat([q, k], dim=1)))
        out = self.attn(qk[:, :heads], qk[:, heads:], v, ctx)  # [T, heads * d]
        gated = out * torch.sigmoid(gate.reshape(n, -1))
        result: torch.Tensor = self.o_proj(gated)
        return result

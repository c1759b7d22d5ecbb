"""Pieces every architecture shares: the attention block and the causal-LM shell."""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.model.config import ModelConfig
from hybridkv.model.layers.attention import PagedAttention
from hybridkv.model.layers.rotary import RotaryCosSin
from hybridkv.model.step_context import StepContext


class SelfAttention(nn.Module):
    """q/k/v projections, optional per-head q/k norms, RoPE, paged attention, output proj."""

    def __init__(
        self,
        layer_id: int,
        cfg: ModelConfig,
        scale: float,
        qk_norm: type[nn.Module] | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        heads, kv_heads, d = cfg.num_attention_heads, cfg.num_kv_heads, cfg.head_dim
        bias = bool(cfg.raw.get("attention_bias", False))
        self.q_proj = nn.Linear(cfg.hidden_size, heads * d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(heads * d, cfg.hidden_size, bias=bias)
        if qk_norm is not None:
            self.q_norm = qk_norm(d, cfg.rms_norm_eps)
            self.k_norm = qk_norm(d, cfg.rms_norm_eps)
        self.has_qk_norm = qk_norm is not None
        self.head_dim = d
        self.attn = PagedAttention(layer_id, heads, kv_heads, d, scale, softcap)

    def forward(self, x: torch.Tensor, rope: RotaryCosSin | None, ctx: StepContext) -> torch.Tensor:
        q = self.q_proj(x).unflatten(-1, (-1, self.head_dim))  # [T, heads, d]
        k = self.k_proj(x).unflatten(-1, (-1, self.head_dim))  # [T, kv_heads, d]
        v = self.v_proj(x).unflatten(-1, (-1, self.head_dim))  # [T, kv_heads, d]
        if self.has_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = rope.apply(q), rope.apply(k)
        out: torch.Tensor = self.o_proj(self.attn(q, k, v, ctx))  # [T, hidden]
        return out


class CausalLM(nn.Module):
    """The runner's view of a model: hidden states for the flat tokens, then logits."""

    config: ModelConfig
    lm_head: nn.Linear

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """``[T]`` token ids -> final hidden states ``[T, hidden]``."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, hidden]`` -> float32 logits ``[n, vocab]`` (model-specific scaling applied)."""
        logits: torch.Tensor = self.lm_head(hidden)
        return logits.float()

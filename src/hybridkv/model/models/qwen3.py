"""Qwen3: pre-norm decoder, per-head q/k RMSNorm, GQA, optional sliding layers."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from hybridkv.model.config.model_config import ModelConfig
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.mlp import GatedMLP
from hybridkv.model.layers.norm import RMSNorm
from hybridkv.model.layers.rotary import RotaryCosSin, RotaryTable
from hybridkv.model.layers.step_context import StepContext
from hybridkv.model.models.common import CausalLM, SelfAttention


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelConfig) -> None:
        super().__init__()
        act = str(cfg.raw.get("hidden_act", "silu"))
        self.self_attn = SelfAttention(layer_id, cfg, cfg.head_dim**-0.5, qk_norm=RMSNorm)
        self.mlp = GatedMLP(cfg.hidden_size, int(cfg.raw["intermediate_size"]), act)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: RotaryCosSin, ctx: StepContext) -> torch.Tensor:
        """``x`` is the forward pass's own residual stream: updated in place and returned."""
        return x.add_(self.deferred(x, None, rope, ctx))

    def deferred(
        self, x: torch.Tensor, pending: torch.Tensor | None, rope: RotaryCosSin, ctx: StepContext
    ) -> torch.Tensor:
        """``forward`` with the residual adds around it deferred: ``x += pending`` (the last
        layer's output, folded into this layer's input norm), and this layer's MLP output
        returned for the next one to add (one pass over ``x`` fewer per layer)."""
        norm = self.input_layernorm
        attn = self.self_attn(norm(x) if pending is None else norm.add_norm(pending, x), rope, ctx)
        h = self.post_attention_layernorm.add_norm(attn, x)  # x += attn; norm(x)
        out: torch.Tensor = self.mlp(h)
        return out


class Qwen3Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(i, cfg) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen3ForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Qwen3Model(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryTable(cfg.rope)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary.lookup(ctx.positions, ctx.max_position, x.dtype)
        pending = None
        for layer in cast("list[Qwen3DecoderLayer]", self.model.layers):
            pending = layer.deferred(x, pending, rope, ctx)
        out: torch.Tensor = (
            self.model.norm(x) if pending is None else self.model.norm.add_norm(pending, x)
        )
        return out

"""Granite 4.0-H: Mamba2 and attention layers, each followed by a shared MLP (plus a top-k
MoE when ``num_local_experts > 0``); embedding, attention, residual multipliers and
``logits_scaling``; RoPE only when ``position_embedding_type == "rope"``."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from hybridkv.model.config.model_config import LayerKind, ModelConfig
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.mamba2 import Mamba2Mixer
from hybridkv.model.layers.mlp import FusedGatedMLP, TopKMoE
from hybridkv.model.layers.norm import RMSNorm
from hybridkv.model.layers.rotary import RotaryCosSin, RotaryTable
from hybridkv.model.layers.step_context import StepContext
from hybridkv.model.models.common import CausalLM, SelfAttention


class GraniteMoeHybridDecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelConfig) -> None:
        super().__init__()
        raw, hidden = cfg.raw, cfg.hidden_size
        act = str(raw.get("hidden_act", "silu"))
        self.input_layernorm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.is_mamba = cfg.layer_kinds[layer_id] is LayerKind.MAMBA
        if self.is_mamba:
            assert cfg.mamba is not None
            self.mamba = Mamba2Mixer(layer_id, hidden, cfg.mamba, cfg.rms_norm_eps)
        else:
            scale = float(raw.get("attention_multiplier", cfg.head_dim**-0.5))
            self.self_attn = SelfAttention(layer_id, cfg, scale)
        self.shared_mlp = FusedGatedMLP(hidden, int(raw.get("shared_intermediate_size", 1024)), act)
        num_experts = int(raw.get("num_local_experts") or 0)
        self.has_experts = num_experts > 0
        if self.has_experts:
            inner, top_k = int(raw["intermediate_size"]), int(raw.get("num_experts_per_tok", 2))
            self.block_sparse_moe = TopKMoE(hidden, inner, num_experts, top_k, act)
        self.residual_multiplier = float(raw.get("residual_multiplier", 1.0))

    def forward(self, x: torch.Tensor, rope: RotaryCosSin | None, ctx: StepContext) -> torch.Tensor:
        """``x`` is the forward pass's own residual stream: updated in place and returned."""
        return x.add_(self._scaled_(self.deferred(x, None, rope, ctx)))

    def deferred(
        self,
        x: torch.Tensor,
        pending: torch.Tensor | None,
        rope: RotaryCosSin | None,
        ctx: StepContext,
    ) -> torch.Tensor:
        """``forward`` with the residual adds folded into the norms after them: ``x +=
        pending * residual_multiplier`` (the last layer's MLP output) inside this layer's
        input norm, ``x +=`` the scaled mixer output inside the post-attention norm; this
        layer's MLP output is returned, unscaled, for the next norm to scale and add
        (``add_norm``'s ``x_scale``: the multiply and the add in the norm's one call). Same
        sums as ``x + h * residual_multiplier``, without a pass over a fresh ``x`` per add."""
        norm, scale = self.input_layernorm, self.residual_multiplier
        h = norm(x) if pending is None else norm.add_norm(pending, x, scale)
        h = self.mamba(h, ctx) if self.is_mamba else self.self_attn(h, rope, ctx)
        h = self.post_attention_layernorm.add_norm(h, x, scale)
        mlp: torch.Tensor = self.shared_mlp(h)
        if self.has_experts:
            mlp = self.block_sparse_moe(h) + mlp
        return mlp

    def _scaled_(self, h: torch.Tensor) -> torch.Tensor:
        """``h * residual_multiplier`` written over ``h`` (a sublayer's fresh output)."""
        return h if self.residual_multiplier == 1.0 else h.mul_(self.residual_multiplier)


class GraniteMoeHybridModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            GraniteMoeHybridDecoderLayer(i, cfg) for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class GraniteMoeHybridForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = GraniteMoeHybridModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        use_rope = cfg.raw.get("position_embedding_type") == "rope"
        self.rotary = RotaryTable(cfg.rope) if use_rope else None
        self.embedding_multiplier = float(cfg.raw.get("embedding_multiplier", 1.0))
        self.logits_scaling = float(cfg.raw.get("logits_scaling", 1.0))

    def embed_input(self, input_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.model.embed_tokens(input_ids) * self.embedding_multiplier
        return out

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed_input(input_ids)  # [T, hidden]
        rope = None
        if self.rotary is not None:
            rope = self.rotary.lookup(ctx.positions, ctx.max_position, x.dtype)
        pending, scale = None, 1.0
        for layer in cast("list[GraniteMoeHybridDecoderLayer]", self.model.layers):
            pending, scale = layer.deferred(x, pending, rope, ctx), layer.residual_multiplier
        out: torch.Tensor = (
            self.model.norm(x) if pending is None else self.model.norm.add_norm(pending, x, scale)
        )
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden)
        return (logits / self.logits_scaling).float()

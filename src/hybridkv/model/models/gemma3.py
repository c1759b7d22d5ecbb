"""Gemma 3 (text): sandwich norms with ``(1 + w)`` RMSNorm, q/k norms, scaled embeddings,
local RoPE base on sliding layers, ``query_pre_attn_scalar`` and final logit soft-capping.

NOTE: transformers 5.23 never passes ``attn_logit_softcapping`` to Gemma 3's attention (the
released configs set it to null; Gemma 3 replaced it with q/k norms), so neither do we.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from hybridkv.model.config.model_config import LayerKind, ModelConfig
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.mlp import GatedMLP
from hybridkv.model.layers.norm import OffsetRMSNorm
from hybridkv.model.layers.rotary import RotaryCosSin, RotaryTable
from hybridkv.model.layers.step_context import StepContext
from hybridkv.model.models.common import CausalLM, SelfAttention


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelConfig) -> None:
        super().__init__()
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        scale = float(cfg.raw.get("query_pre_attn_scalar", cfg.head_dim)) ** -0.5
        act = str(cfg.raw.get("hidden_activation", "gelu_pytorch_tanh"))
        self.is_sliding = cfg.layer_kinds[layer_id] is LayerKind.SLIDING
        self.self_attn = SelfAttention(layer_id, cfg, scale, qk_norm=OffsetRMSNorm)
        self.mlp = GatedMLP(hidden, int(cfg.raw["intermediate_size"]), act)
        self.input_layernorm = OffsetRMSNorm(hidden, eps)
        self.post_attention_layernorm = OffsetRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = OffsetRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = OffsetRMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, rope: RotaryCosSin, ctx: StepContext) -> torch.Tensor:
        """``x`` is the forward pass's own residual stream: updated in place and returned."""
        return x.add_(self.deferred(x, None, rope, ctx))

    def deferred(
        self, x: torch.Tensor, pending: torch.Tensor | None, rope: RotaryCosSin, ctx: StepContext
    ) -> torch.Tensor:
        """``forward`` with ``x += pending`` folded into the input norm and this layer's last
        residual add left to the next one: what it would add is returned."""
        norm = self.input_layernorm
        attn = self.self_attn(norm(x) if pending is None else norm.add_norm(pending, x), rope, ctx)
        h = self.pre_feedforward_layernorm.add_norm(self.post_attention_layernorm.norm_(attn), x)
        out: torch.Tensor = self.post_feedforward_layernorm.norm_(self.mlp(h))
        return out


class Gemma3TextModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(i, cfg) for i in range(cfg.num_hidden_layers)
        )
        self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Gemma3ForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Gemma3TextModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary_global = RotaryTable(cfg.rope)
        self.rotary_local = RotaryTable(cfg.local_rope or cfg.rope)
        self.embed_scale = cfg.hidden_size**0.5
        self.final_softcap = cfg.raw.get("final_logit_softcapping")

    def embed_input(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        out: torch.Tensor = x * torch.tensor(self.embed_scale, dtype=x.dtype)  # rounded to dtype
        return out

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed_input(input_ids)  # [T, hidden]
        rope_global = self.rotary_global.lookup(ctx.positions, ctx.max_position, x.dtype)
        rope_local = self.rotary_local.lookup(ctx.positions, ctx.max_position, x.dtype)
        pending = None
        for layer in cast("list[Gemma3DecoderLayer]", self.model.layers):
            pending = layer.deferred(
                x, pending, rope_local if layer.is_sliding else rope_global, ctx
            )
        out: torch.Tensor = (
            self.model.norm(x) if pending is None else self.model.norm.add_norm(pending, x)
        )
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden)
        if self.final_softcap:
            cap = float(self.final_softcap)
            logits = torch.tanh(logits / cap) * cap
        return logits.float()


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """A Gemma 3 multimodal checkpoint (>= 4B) run as its text model: the language model's
    weights under ``model.language_model.`` (transformers 5) or ``language_model.model.``
    (4.x); the vision tower and projector are skipped. Image placeholder ids are rejected at
    ``add_request`` (``ModelConfig.media_token_ids``)."""

    checkpoint_prefixes = (
        ("model.", "model.language_model."),
        ("model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
    )
    ignored_prefixes = (
        "model.vision_tower.",
        "model.multi_modal_projector.",
        "vision_tower.",
        "multi_modal_projector.",
    )

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        # NOTE: transformers 5.23's Gemma3ForConditionalGeneration never applies
        # final_logit_softcapping (the released checkpoints set it to null anyway); neither do we.
        self.final_softcap = None

"""Qwen3-Next and Qwen3.5 (text): Gated DeltaNet and gated full attention layers (3:1 by
``layer_types``), (1 + w) RMSNorms, partial RoPE; the MLP of a layer is a softmax top-k MoE
with a sigmoid-gated shared expert (``num_experts > 0`` on every ``decoder_sparse_step``-th
layer not in ``mlp_only_layers``) or a dense gated MLP.

Qwen3-Next packs its DeltaNet projections per key-head group, Qwen3.5 keeps them apart
(``hybridkv.model.layers.gated_deltanet``). ``Qwen3_5ForConditionalGeneration`` checkpoints
run their text model; the vision tower is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hybridkv.model.config.model_config import LayerKind, ModelConfig
from hybridkv.model.layers.gated_deltanet import GatedDeltaNet
from hybridkv.model.layers.linear import Linear, linear
from hybridkv.model.layers.mlp import GatedMLP, activation
from hybridkv.model.layers.moe import dispatch, expert_linear, softmax_top_k
from hybridkv.model.layers.norm import OffsetRMSNorm
from hybridkv.model.layers.rotary import RotaryCosSin, RotaryTable
from hybridkv.model.layers.step_context import StepContext
from hybridkv.model.models.common import CausalLM
from hybridkv.model.models.gated_attention import GatedSelfAttention


class _Experts(nn.Module):
    """``gate_proj``/``up_proj`` ``[E, I, H]``, ``down_proj`` ``[E, H, I]``."""

    is_expert_stack = True  # matmul.upcast_matmuls holds these in the matmul dtype

    def __init__(self, num: int, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(num, inner, hidden))
        self.up_proj = nn.Parameter(torch.empty(num, inner, hidden))
        self.down_proj = nn.Parameter(torch.empty(num, hidden, inner))


class _Router(nn.Module):
    def __init__(self, num: int, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, hidden))


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        raw, hidden = cfg.raw, cfg.hidden_size
        self.num_experts = int(raw["num_experts"])
        self.top_k = int(raw.get("num_experts_per_tok", 2))
        # NOTE: Qwen3.5-MoE always renormalises the top-k weights (transformers 5.23 ignores
        # its norm_topk_prob); Qwen3-Next follows norm_topk_prob
        qwen3_5 = str(raw.get("model_type", "")).startswith("qwen3_5")
        self.renormalize = qwen3_5 or bool(raw.get("norm_topk_prob", True))
        act = str(raw.get("hidden_act", "silu"))
        self.gate = _Router(self.num_experts, hidden)
        self.experts = _Experts(self.num_experts, hidden, int(raw["moe_intermediate_size"]))
        self.shared_expert = GatedMLP(hidden, int(raw["shared_expert_intermediate_size"]), act)
        self.shared_expert_gate = Linear(hidden, 1, bias=False)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, idx = softmax_top_k(linear(x, self.gate.weight), self.top_k, self.renormalize)
        routed = dispatch(x, idx, weights.to(x.dtype), self.num_experts, self._expert)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        out: torch.Tensor = routed + shared
        return out

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        w = self.experts
        h = self.act(expert_linear(rows, w.gate_proj, e)) * expert_linear(rows, w.up_proj, e)
        return expert_linear(h, w.down_proj, e)


def _is_moe_layer(raw: Mapping[str, Any], layer_id: int) -> bool:
    if int(raw.get("num_experts") or 0) <= 0 or layer_id in (raw.get("mlp_only_layers") or ()):
        return False
    return (layer_id + 1) % int(raw.get("decoder_sparse_step", 1)) == 0


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelConfig, packed: bool) -> None:
        super().__init__()
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.is_linear = cfg.layer_kinds[layer_id] is LayerKind.GDN
        if self.is_linear:
            assert cfg.gdn is not None
            self.linear_attn = GatedDeltaNet(layer_id, hidden, cfg.gdn, eps, packed)
        else:
            self.self_attn = GatedSelfAttention(layer_id, cfg)
        self.mlp: nn.Module
        if _is_moe_layer(cfg.raw, layer_id):
            self.mlp = SparseMoeBlock(cfg)
        else:
            act = str(cfg.raw.get("hidden_act", "silu"))
            self.mlp = GatedMLP(hidden, int(cfg.raw["intermediate_size"]), act)
        self.input_layernorm = OffsetRMSNorm(hidden, eps)
        self.post_attention_layernorm = OffsetRMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, rope: RotaryCosSin, ctx: StepContext) -> torch.Tensor:
        h = self.input_layernorm(x)
        x = x + (self.linear_attn(h, ctx) if self.is_linear else self.self_attn(h, rope, ctx))
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class Qwen3NextModel(nn.Module):
    def __init__(self, cfg: ModelConfig, packed: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            Qwen3NextDecoderLayer(i, cfg, packed) for i in range(cfg.num_hidden_layers)
        )
        self.norm = OffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen3NextForCausalLM(CausalLM):
    packed_projections = True  # Qwen3-Next's in_proj_qkvz / in_proj_ba

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Qwen3NextModel(cfg, self.packed_projections)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryTable(cfg.rope)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary.lookup(ctx.positions, ctx.max_position, x.dtype)
        for layer in self.model.layers:
            x = layer(x, rope, ctx)
        out: torch.Tensor = self.model.norm(x)
        return out


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    packed_projections = False


class Qwen3_5ForConditionalGeneration(Qwen3_5ForCausalLM):
    """The text model of a Qwen3.5 multimodal checkpoint (``model.language_model.*``)."""

    checkpoint_prefixes = (("model.", "model.language_model."),)
    ignored_prefixes = ("model.visual.",)

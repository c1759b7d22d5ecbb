"""Nemotron-H: one mixer per layer (``M`` Mamba2, ``*`` attention without RoPE, ``-`` MLP,
``E`` MoE), each pre-normed with a residual around it.

The MLP is not gated (``down(relu2(up(x)))``). The MoE routes with sigmoid scores plus a
correction bias, choosing the top groups first (``n_group``/``topk_group``), weights the
chosen experts by their plain sigmoid scores (renormalised if ``norm_topk_prob``) times
``routed_scaling_factor``, and adds a shared expert; optional latent projections wrap the
routed experts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hybridkv.model.config.model_config import LayerKind, ModelConfig
from hybridkv.model.layers.linear import Linear, linear
from hybridkv.model.layers.mamba2 import Mamba2Mixer
from hybridkv.model.layers.mlp import activation
from hybridkv.model.layers.moe import dispatch, expert_linear
from hybridkv.model.layers.norm import RMSNorm
from hybridkv.model.layers.step_context import StepContext
from hybridkv.model.models.common import CausalLM, SelfAttention


class NemotronHMLP(nn.Module):
    def __init__(self, hidden: int, inner: int, act: str, bias: bool) -> None:
        super().__init__()
        self.up_proj = Linear(hidden, inner, bias=bias)
        self.down_proj = Linear(inner, hidden, bias=bias)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(self.act(self.up_proj(x)))
        return out


class NemotronHRouter(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        raw = cfg.raw
        self.num_experts = int(raw["n_routed_experts"])
        self.weight = nn.Parameter(torch.empty(self.num_experts, cfg.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(self.num_experts))
        self.top_k = int(raw.get("num_experts_per_tok", 2))
        self.num_groups = int(raw.get("n_group", 1))
        self.top_groups = int(raw.get("topk_group", 1))
        self.renormalize = bool(raw.get("norm_topk_prob", True))
        self.scale = float(raw.get("routed_scaling_factor", 1.0))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[T, H]`` -> weights ``[T, k]`` (float32), expert ids ``[T, k]``."""
        scores = linear(x.float(), self.weight.float()).sigmoid()  # [T, E]
        choice = scores + self.e_score_correction_bias.float()
        per_group = choice.view(-1, self.num_groups, self.num_experts // self.num_groups)
        group_scores = per_group.topk(min(2, per_group.shape[-1]), dim=-1)[0].sum(-1)  # [T, G]
        groups = group_scores.topk(self.top_groups, dim=-1, sorted=False)[1]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
        keep = keep[..., None].expand_as(per_group).reshape(choice.shape)
        idx = choice.masked_fill(~keep, float("-inf")).topk(self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scale, idx


class NemotronHExperts(nn.Module):
    is_expert_stack = True  # matmul.upcast_matmuls holds these in the matmul dtype

    def __init__(self, num_experts: int, inner: int, dim: int) -> None:
        super().__init__()
        self.up_proj = nn.Parameter(torch.empty(num_experts, inner, dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, dim, inner))


class NemotronHMoE(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        raw, hidden = cfg.raw, cfg.hidden_size
        act, bias = str(raw.get("mlp_hidden_act", "relu2")), bool(raw.get("mlp_bias", False))
        latent = raw.get("moe_latent_size")
        dim = int(latent) if latent else hidden
        self.gate = NemotronHRouter(cfg)
        self.experts = NemotronHExperts(
            self.gate.num_experts, int(raw["moe_intermediate_size"]), dim
        )
        shared = int(raw["moe_shared_expert_intermediate_size"])
        self.shared_experts = NemotronHMLP(hidden, shared, act, bias)
        self.has_latent = bool(latent)
        if latent:
            self.fc1_latent_proj = Linear(hidden, dim, bias=bias)
            self.fc2_latent_proj = Linear(dim, hidden, bias=bias)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, idx = self.gate(x)
        h = self.fc1_latent_proj(x) if self.has_latent else x
        routed = dispatch(h, idx, weights, self.gate.num_experts, self._expert)
        if self.has_latent:
            routed = self.fc2_latent_proj(routed)
        out: torch.Tensor = routed + self.shared_experts(x)
        return out

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        w = self.experts
        return expert_linear(self.act(expert_linear(rows, w.up_proj, e)), w.down_proj, e)


class NemotronHBlock(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelConfig) -> None:
        super().__init__()
        raw, hidden = cfg.raw, cfg.hidden_size
        self.norm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.kind = cfg.layer_kinds[layer_id]
        self.mixer: nn.Module
        if self.kind is LayerKind.MAMBA:
            assert cfg.mamba is not None
            self.mixer = Mamba2Mixer(layer_id, hidden, cfg.mamba, cfg.rms_norm_eps)
        elif self.kind is LayerKind.FULL:
            self.mixer = SelfAttention(layer_id, cfg, cfg.head_dim**-0.5)
        elif _is_moe(raw, layer_id):
            self.mixer = NemotronHMoE(cfg)
        else:
            act, bias = str(raw.get("mlp_hidden_act", "relu2")), bool(raw.get("mlp_bias", False))
            self.mixer = NemotronHMLP(hidden, int(raw["intermediate_size"]), act, bias)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        h = self.norm(x)
        if self.kind is LayerKind.MAMBA:
            h = self.mixer(h, ctx)
        elif self.kind is LayerKind.FULL:
            h = self.mixer(h, None, ctx)
        else:
            h = self.mixer(h)
        out: torch.Tensor = x + h
        return out


def _is_moe(raw: Mapping[str, Any], layer_id: int) -> bool:
    """``moe`` in the 5.x ``layers_block_type`` list, ``E`` in the legacy pattern."""
    names = raw.get("layers_block_type")
    if names:
        return bool(names[layer_id] == "moe")
    return bool(str(raw.get("hybrid_override_pattern", ""))[layer_id : layer_id + 1] == "E")


class NemotronHModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(NemotronHBlock(i, cfg) for i in range(cfg.num_hidden_layers))
        self.norm_f = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class NemotronHForCausalLM(CausalLM):
    checkpoint_prefixes = (("model.", "backbone."),)  # NVIDIA's (and save_pretrained's) names

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = NemotronHModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def embedding(self) -> nn.Embedding:
        return self.model.embeddings

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.model.embeddings(input_ids)  # [T, hidden]
        for layer in self.model.layers:
            x = layer(x, ctx)
        out: torch.Tensor = self.model.norm_f(x)
        return out

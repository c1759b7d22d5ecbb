"""IBM Bamba: Mamba2 and attention layers (``attn_layer_indices``), each followed by a gated
MLP; RoPE on half of each head (``partial_rotary_factor`` 0.5, fixed by transformers)."""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.model.config.model_config import LayerKind, ModelConfig
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.mamba2 import Mamba2Mixer
from hybridkv.model.layers.mlp import GatedMLP
from hybridkv.model.layers.norm import RMSNorm
from hybridkv.model.layers.rotary import RotaryCosSin, RotaryTable
from hybridkv.model.layers.step_context import StepContext
from hybridkv.model.models.common import CausalLM, SelfAttention


class BambaDecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = cfg.hidden_size
        self.input_layernorm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.is_mamba = cfg.layer_kinds[layer_id] is LayerKind.MAMBA
        if self.is_mamba:
            assert cfg.mamba is not None
            self.mamba = Mamba2Mixer(layer_id, hidden, cfg.mamba, cfg.rms_norm_eps)
        else:
            self.self_attn = SelfAttention(layer_id, cfg, cfg.head_dim**-0.5)
        act = str(cfg.raw.get("hidden_act", "silu"))
        self.feed_forward = GatedMLP(hidden, int(cfg.raw["intermediate_size"]), act)

    def forward(self, x: torch.Tensor, rope: RotaryCosSin, ctx: StepContext) -> torch.Tensor:
        h = self.input_layernorm(x)
        x = x + (self.mamba(h, ctx) if self.is_mamba else self.self_attn(h, rope, ctx))
        out: torch.Tensor = x + self.feed_forward(self.pre_ff_layernorm(x))
        return out


class BambaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(BambaDecoderLayer(i, cfg) for i in range(cfg.num_hidden_layers))
        self.final_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class BambaForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = BambaModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryTable(cfg.rope)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary.lookup(ctx.positions, ctx.max_position, x.dtype)
        for layer in self.model.layers:
            x = layer(x, rope, ctx)
        out: torch.Tensor = self.model.final_layernorm(x)
        return out

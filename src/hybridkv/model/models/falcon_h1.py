"""Falcon-H1: every decoder layer runs a Mamba2 mixer and attention side by side on the same
normed input and adds both to the residual, then a gated MLP; MuP multipliers throughout.

Cache layers (``hybridkv.model.config.layer_kinds``): decoder layer i is cache layer ``2i``
(its Mamba2 state) and ``2i + 1`` (its K/V). ``key_multiplier`` scales K before RoPE; RoPE is
linear, so it is folded into the attention scale (the cache holds unscaled K).
"""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.model.config.model_config import MambaConfig, ModelConfig
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.mamba2 import Mamba2Mixer
from hybridkv.model.layers.mlp import activation
from hybridkv.model.layers.norm import RMSNorm
from hybridkv.model.layers.rotary import RotaryCosSin, RotaryTable
from hybridkv.model.layers.step_context import StepContext
from hybridkv.model.models.common import CausalLM, SelfAttention


class FalconH1MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden, inner = cfg.hidden_size, int(cfg.raw["intermediate_size"])
        bias = bool(cfg.raw.get("mlp_bias", False))
        self.gate_proj = Linear(hidden, inner, bias=bias)
        self.up_proj = Linear(hidden, inner, bias=bias)
        self.down_proj = Linear(inner, hidden, bias=bias)
        self.act = activation(str(cfg.raw.get("hidden_act", "silu")))
        mults = cfg.raw.get("mlp_multipliers") or (1.0, 1.0)
        self.gate_mult, self.down_mult = float(mults[0]), float(mults[1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.up_proj(x) * self.act(self.gate_proj(x) * self.gate_mult)
        out: torch.Tensor = self.down_proj(y) * self.down_mult
        return out


def mup_vector(m: MambaConfig, multipliers: list[float]) -> torch.Tensor:
    """Per-channel scale of the Mamba input projection: z, x, B, C, dt sections."""
    span = m.n_groups * m.d_state
    sizes = [m.intermediate_size, m.intermediate_size, span, span, m.num_heads]
    parts = [torch.full((n,), float(f)) for n, f in zip(sizes, multipliers, strict=True)]
    return torch.cat(parts)


class FalconH1DecoderLayer(nn.Module):
    def __init__(self, index: int, cfg: ModelConfig) -> None:
        super().__init__()
        raw, hidden = cfg.raw, cfg.hidden_size
        assert cfg.mamba is not None
        self.input_layernorm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.pre_ff_layernorm = RMSNorm(hidden, cfg.rms_norm_eps)
        self.mamba = Mamba2Mixer(2 * index, hidden, cfg.mamba, cfg.rms_norm_eps)
        with torch.device("cpu"):
            scale = mup_vector(cfg.mamba, list(raw.get("ssm_multipliers") or [1.0] * 5))
        self.mamba.proj_scale = scale
        key_mult = float(raw.get("key_multiplier", 1.0))
        self.self_attn = SelfAttention(2 * index + 1, cfg, cfg.head_dim**-0.5 * key_mult)
        self.feed_forward = FalconH1MLP(cfg)
        self.ssm_in = float(raw.get("ssm_in_multiplier", 1.0))
        self.ssm_out = float(raw.get("ssm_out_multiplier", 1.0))
        self.attn_in = float(raw.get("attention_in_multiplier", 1.0))
        self.attn_out = float(raw.get("attention_out_multiplier", 1.0))

    def forward(self, x: torch.Tensor, rope: RotaryCosSin, ctx: StepContext) -> torch.Tensor:
        h = self.input_layernorm(x)
        ssm = self.mamba(h * self.ssm_in, ctx) * self.ssm_out
        attn = self.self_attn(h * self.attn_in, rope, ctx) * self.attn_out
        x = x + (ssm + attn)
        out: torch.Tensor = x + self.feed_forward(self.pre_ff_layernorm(x))
        return out


class FalconH1Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        decoder_layers = cfg.num_hidden_layers // 2
        self.layers = nn.ModuleList(FalconH1DecoderLayer(i, cfg) for i in range(decoder_layers))
        self.final_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class FalconH1ForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = FalconH1Model(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryTable(cfg.rope)
        self.embedding_multiplier = float(cfg.raw.get("embedding_multiplier", 1.0))
        self.lm_head_multiplier = float(cfg.raw.get("lm_head_multiplier", 1.0))

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids) * self.embedding_multiplier  # [T, hidden]
        rope = self.rotary.lookup(ctx.positions, ctx.max_position, x.dtype)
        for layer in self.model.layers:
            x = layer(x, rope, ctx)
        out: torch.Tensor = self.model.final_layernorm(x)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden)
        return (logits * self.lm_head_multiplier).float()

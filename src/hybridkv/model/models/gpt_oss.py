"""OpenAI gpt-oss: alternating sliding-window and full attention layers (two cache groups)
with biases and per-head attention sinks, YaRN RoPE, and a top-k MoE on every layer whose
experts use a clamped SwiGLU: ``(clamp(up, ±limit) + 1) * g * sigmoid(alpha * g)`` with
``g = min(gate, limit)``, gate and up interleaved in ``gate_up_proj``."""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.model.config.model_config import LayerKind, ModelConfig
from hybridkv.model.layers.linear import Linear, linear
from hybridkv.model.layers.moe import dispatch
from hybridkv.model.layers.norm import RMSNorm
from hybridkv.model.layers.rotary import RotaryCosSin, RotaryTable
from hybridkv.model.layers.step_context import StepContext
from hybridkv.model.models.common import CausalLM, SelfAttention


class _Experts(nn.Module):
    """``x @ gate_up_proj[e] + bias`` ``[E, H, 2I]``; ``h @ down_proj[e] + bias`` ``[E, I, H]``."""

    is_expert_stack = True  # matmul.upcast_matmuls holds these in the matmul dtype

    def __init__(self, num: int, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num, hidden, 2 * inner))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num, 2 * inner))
        self.down_proj = nn.Parameter(torch.empty(num, inner, hidden))
        self.down_proj_bias = nn.Parameter(torch.empty(num, hidden))


class GptOssMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        raw, hidden = cfg.raw, cfg.hidden_size
        self.num_experts = int(raw["num_local_experts"])
        self.top_k = int(raw.get("num_experts_per_tok", 4))
        self.router = Linear(hidden, self.num_experts, bias=True)
        self.experts = _Experts(self.num_experts, hidden, int(raw["intermediate_size"]))
        self.alpha = float(raw.get("swiglu_alpha", 1.702))
        self.limit = float(raw.get("swiglu_limit", 7.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top_logits, idx = self.router(x).topk(self.top_k, dim=-1)  # [T, k]
        weights = torch.softmax(top_logits, dim=-1)
        return dispatch(x, idx, weights, self.num_experts, self._expert)

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        w = self.experts
        gate_up = linear(rows, w.gate_up_proj[e].t(), w.gate_up_proj_bias[e])
        gate = gate_up[..., ::2].clamp(max=self.limit)
        up = gate_up[..., 1::2].clamp(-self.limit, self.limit)
        h = (up + 1) * gate * torch.sigmoid(gate * self.alpha)
        return linear(h, w.down_proj[e].t(), w.down_proj_bias[e])


class GptOssDecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelConfig) -> None:
        super().__init__()
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = SelfAttention(layer_id, cfg, cfg.head_dim**-0.5, sinks=True)
        self.mlp = GptOssMLP(cfg)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.is_sliding = cfg.layer_kinds[layer_id] is LayerKind.SLIDING

    def forward(self, x: torch.Tensor, rope: RotaryCosSin, ctx: StepContext) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, ctx)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class GptOssModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            GptOssDecoderLayer(i, cfg) for i in range(cfg.num_hidden_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class GptOssForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = GptOssModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryTable(cfg.rope)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        rope = self.rotary.lookup(ctx.positions, ctx.max_position, x.dtype)
        for layer in self.model.layers:
            x = layer(x, rope, ctx)
        out: torch.Tensor = self.model.norm(x)
        return out

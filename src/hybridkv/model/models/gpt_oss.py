"""OpenAI gpt-oss: alternating sliding-window and full attention layers (two cache groups)
with biases and per-head attention sinks, YaRN RoPE, and a top-k MoE on every layer whose
experts use a clamped SwiGLU: ``(clamp(up, ±limit) + 1) * g * sigmoid(alpha * g)`` with
``g = min(gate, limit)``, gate and up interleaved in ``gate_up_proj``. The experts of an MXFP4
checkpoint (``quantization_config``, ``model/config/quant_config.py``) stay MXFP4
(``Mxfp4Experts``) and multiply on ``native/mxfp4.c``."""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.config.model_config import LayerKind, ModelConfig
from hybridkv.model.config.quant_config import parse_hub_quant
from hybridkv.model.layers.linear import Linear, linear
from hybridkv.model.layers.moe import dispatch
from hybridkv.model.layers.norm import RMSNorm
from hybridkv.model.layers.rotary import RotaryCosSin, RotaryTable
from hybridkv.model.layers.step_context import StepContext
from hybridkv.model.models.common import CausalLM, SelfAttention
from hybridkv.native.mxfp4 import BLOCK_BYTES, BLOCK_VALUES, mxfp4_linear


class _Experts(nn.Module):
    """``x @ gate_up_proj[e] + bias`` ``[E, H, 2I]``; ``h @ down_proj[e] + bias`` ``[E, I, H]``."""

    is_expert_stack = True  # matmul.upcast_matmuls holds these in the matmul dtype

    def __init__(self, num: int, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num, hidden, 2 * inner))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num, 2 * inner))
        self.down_proj = nn.Parameter(torch.empty(num, inner, hidden))
        self.down_proj_bias = nn.Parameter(torch.empty(num, hidden))

    def gate_up(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.gate_up_proj[e].t(), self.gate_up_proj_bias[e])  # [n, 2I]

    def down(self, e: int, h: torch.Tensor) -> torch.Tensor:
        return linear(h, self.down_proj[e].t(), self.down_proj_bias[e])  # [n, H]


class Mxfp4Experts(nn.Module):
    """The experts as MXFP4 checkpoints store them (``native/mxfp4.py``: 32 values a block):
    ``gate_up_proj_blocks [E, 2I, H/32, 16]`` + ``gate_up_proj_scales [E, 2I, H/32]`` (rows:
    gate and up interleaved), ``down_proj_blocks [E, H, I/32, 16]`` + ``down_proj_scales``,
    float biases. Products in float32, returned in the activations' dtype."""

    def __init__(self, num: int, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate_up_proj_blocks, self.gate_up_proj_scales = _mxfp4(num, 2 * inner, hidden)
        self.down_proj_blocks, self.down_proj_scales = _mxfp4(num, hidden, inner)
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num, 2 * inner))
        self.down_proj_bias = nn.Parameter(torch.empty(num, hidden))

    def gate_up(self, e: int, x: torch.Tensor) -> torch.Tensor:
        blocks, scales = self.gate_up_proj_blocks[e], self.gate_up_proj_scales[e]
        return mxfp4_linear(x, blocks, scales, self.gate_up_proj_bias[e].float()).to(x.dtype)

    def down(self, e: int, h: torch.Tensor) -> torch.Tensor:
        blocks, scales = self.down_proj_blocks[e], self.down_proj_scales[e]
        return mxfp4_linear(h, blocks, scales, self.down_proj_bias[e].float()).to(h.dtype)


def _mxfp4(num: int, out_dim: int, in_dim: int) -> tuple[nn.Parameter, nn.Parameter]:
    """Empty MXFP4 blocks ``[num, out, in/32, 16]`` and scales ``[num, out, in/32]``."""
    if in_dim % BLOCK_VALUES:
        raise ModelLoadError(f"MXFP4 experts: {in_dim} inputs, not a multiple of {BLOCK_VALUES}")
    groups = in_dim // BLOCK_VALUES
    blocks = torch.empty(num, out_dim, groups, BLOCK_BYTES, dtype=torch.uint8)
    scales = torch.empty(num, out_dim, groups, dtype=torch.uint8)
    return nn.Parameter(blocks, requires_grad=False), nn.Parameter(scales, requires_grad=False)


class GptOssMLP(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelConfig) -> None:
        super().__init__()
        raw, hidden = cfg.raw, cfg.hidden_size
        self.num_experts = int(raw["num_local_experts"])
        self.top_k = int(raw.get("num_experts_per_tok", 4))
        self.router = Linear(hidden, self.num_experts, bias=True)
        quant = parse_hub_quant(raw, cfg.architecture)
        name = f"model.layers.{layer_id}.mlp.experts"
        if quant is not None and quant.method == "mxfp4" and quant.converts(name):
            experts_class: type[_Experts | Mxfp4Experts] = Mxfp4Experts
        else:
            experts_class = _Experts
        self.experts = experts_class(self.num_experts, hidden, int(raw["intermediate_size"]))
        self.alpha = float(raw.get("swiglu_alpha", 1.702))
        self.limit = float(raw.get("swiglu_limit", 7.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top_logits, idx = self.router(x).topk(self.top_k, dim=-1)  # [T, k]
        weights = torch.softmax(top_logits, dim=-1)
        return dispatch(x, idx, weights, self.num_experts, self._expert)

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        gate_up = self.experts.gate_up(e, rows)  # [n, 2I]
        gate = gate_up[..., ::2].clamp(max=self.limit)
        up = gate_up[..., 1::2].clamp(-self.limit, self.limit)
        h = (up + 1) * gate * torch.sigmoid(gate * self.alpha)
        return self.experts.down(e, h)


class GptOssDecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: ModelConfig) -> None:
        super().__init__()
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = SelfAttention(layer_id, cfg, cfg.head_dim**-0.5, sinks=True)
        self.mlp = GptOssMLP(layer_id, cfg)
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

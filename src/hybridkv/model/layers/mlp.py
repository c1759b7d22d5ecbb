"""Feed-forward blocks: the gated MLP, Granite's fused shared MLP, and a top-k MoE."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.config.errors import ModelLoadError
from hybridkv.model.layers.fused import FusedLinear
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.moe import dispatch, expert_linear
from hybridkv.model.layers.norm import row_kernels

# activation names -> the native act_mul kernel's (``hybridkv.native.rownorm``)
_KERNEL_ACTS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name in ("silu", "swish"):
        return F.silu
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    if name == "relu2":  # Nemotron-H
        return lambda x: torch.square(F.relu(x))
    raise ModelLoadError(
        f"unsupported activation {name!r}; supported: silu, gelu, gelu_pytorch_tanh, relu2"
    )


def act_mul(
    gate_up: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor], kernel_act: str | None
) -> torch.Tensor:
    """``act(gate) * up`` of ``[T, 2 * inner]`` (gate half first): one native pass for float32
    with a kernel activation, else torch."""
    kernels = row_kernels(gate_up) if kernel_act is not None else None
    if kernels is not None and kernel_act is not None and gate_up.dim() == 2:
        return kernels.act_mul(gate_up, kernel_act)
    gate, up = gate_up.chunk(2, dim=-1)  # [T, inner] each
    out: torch.Tensor = act(gate) * up
    return out


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` (Llama, Qwen, Gemma)."""

    def __init__(self, hidden: int, inner: int, act: str) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, inner, bias=False)
        self.up_proj = Linear(hidden, inner, bias=False)
        self.down_proj = Linear(inner, hidden, bias=False)
        self.act = activation(act)
        self.kernel_act = _KERNEL_ACTS.get(act)  # None: torch only
        self.gate_up = FusedLinear([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(act_mul(self.gate_up(x), self.act, self.kernel_act))
        return out


class FusedGatedMLP(nn.Module):
    """Granite's shared MLP: one ``input_linear`` holding gate and up, halves in that order."""

    def __init__(self, hidden: int, inner: int, act: str) -> None:
        super().__init__()
        self.input_linear = Linear(hidden, 2 * inner, bias=False)
        self.output_linear = Linear(inner, hidden, bias=False)
        self.act = activation(act)
        self.kernel_act = _KERNEL_ACTS.get(act)  # None: torch only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = act_mul(self.input_linear(x), self.act, self.kernel_act)
        out: torch.Tensor = self.output_linear(h)
        return out


class Router(nn.Module):
    def __init__(self, hidden: int, num_experts: int) -> None:
        super().__init__()
        self.layer = Linear(hidden, num_experts, bias=False)


class TopKMoE(nn.Module):
    """Softmax over the top-k router logits; tokens grouped by expert (``moe.dispatch``).

    Weights (Granite MoE layout): ``input_linear.weight [E, 2I, H]`` (gate, up halves) and
    ``output_linear.weight [E, H, I]``.
    """

    def __init__(self, hidden: int, inner: int, num_experts: int, top_k: int, act: str) -> None:
        super().__init__()
        self.router = Router(hidden, num_experts)
        self.input_linear = _ExpertWeights(num_experts, 2 * inner, hidden)
        self.output_linear = _ExpertWeights(num_experts, hidden, inner)
        self.num_experts = num_experts
        self.top_k = top_k
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router.layer(x).float()  # [T, E]
        top_logits, top_idx = logits.topk(self.top_k, dim=-1)  # [T, k]
        weights = torch.softmax(top_logits, dim=-1).to(x.dtype)  # [T, k]
        return dispatch(x, top_idx, weights, self.num_experts, self._expert)

    def _expert(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = expert_linear(x, self.input_linear.weight, expert).chunk(2, dim=-1)
        return expert_linear(self.act(gate) * up, self.output_linear.weight, expert)


class _ExpertWeights(nn.Module):
    def __init__(self, num_experts: int, out_dim: int, in_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, out_dim, in_dim))

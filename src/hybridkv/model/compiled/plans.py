"""Per-family decode plans: each walks a model's layers in the order of its Python
``forward`` (the deferred residual adds folded into the next norm, as there) and emits the
same kernel calls. ``PLANS`` maps a model class to its planner; a model not in it decodes in
Python.

A planner gets the builder and ``Bindings`` (each layer's KV pages or state tensors and its
group's slot in the step) and returns the residual stream (which the embedding fills) and the
final hidden rows (which the lm_head reads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hybridkv.model.compiled.builder import ProgramBuilder, Rows, Unsupported
from hybridkv.model.compiled.mixers import AttnBinding, attention, mamba
from hybridkv.model.layers.fused import FusedLinear
from hybridkv.model.layers.linear import Linear
from hybridkv.model.models.common import CausalLM
from hybridkv.model.models.gemma3 import Gemma3ForCausalLM, Gemma3ForConditionalGeneration
from hybridkv.model.models.granitemoehybrid import GraniteMoeHybridForCausalLM
from hybridkv.model.models.qwen3 import Qwen3ForCausalLM


@dataclass(frozen=True, slots=True)
class Bindings:
    attn: dict[int, AttnBinding]  # layer id -> its pages and attention group slot
    states: dict[int, tuple[tuple[torch.Tensor, ...], int]]  # layer id -> states, group slot


@dataclass(frozen=True, slots=True)
class Plan:
    residual: Rows  # [T, hidden]: the embedding goes here
    hidden: Rows  # [T, hidden]: the final norm's output


class _Stream:
    """The residual stream with its deferred add: ``pending`` (the last layer's output,
    times ``scale``) is added inside the next norm, as the Python ``deferred`` does."""

    def __init__(self, b: ProgramBuilder, hidden_size: int) -> None:
        self.b, self.hidden_size = b, hidden_size
        self.resid, self.normed = b.buffer(hidden_size), b.buffer(hidden_size)
        self.pending: Rows | None = None
        self.scale = 1.0

    def layer(self, index: int) -> None:
        self.b.begin_layer(index)

    def input_norm(self, norm: Any) -> Rows:
        """``norm(x)``, or ``x += pending * scale`` first (``add_norm``)."""
        if self.pending is None:
            return self.b.norm(norm, self.resid, self.normed)
        return self.b.norm(norm, self.pending, self.normed, self.resid, self.scale)

    def add_norm(self, norm: Any, x: Rows, x_scale: float = 1.0) -> Rows:
        """``resid += x * x_scale``, then the norm of it into new rows."""
        return self.b.norm(norm, x, self.b.buffer(self.hidden_size), self.resid, x_scale)

    def plan(self, model: Any) -> Plan:
        """The final norm (``model.model.norm``) of the stream with its pending add."""
        self.b.begin_layer(None)
        self.normed = self.b.buffer(self.hidden_size)  # the lm_head's rows, never reused
        return Plan(self.resid, self.input_norm(model.model.norm))


def _mlp(b: ProgramBuilder, x: Rows, gate_up: Linear | FusedLinear, act: Any, down: Linear) -> Rows:
    """``down(act(gate) * up)`` with ``gate | up`` from one projection."""
    return b.linear(b.act_mul(b.linear(x, gate_up), act), down)


def _attn_of(bind: Bindings, layer_id: int) -> AttnBinding:
    if layer_id not in bind.attn:
        raise Unsupported(f"layer {layer_id} has no attention pages")
    return bind.attn[layer_id]


def plan_gemma3(b: ProgramBuilder, model: Any, bind: Bindings) -> Plan:
    x = _Stream(b, model.config.hidden_size)
    for i, layer in enumerate(model.model.layers):
        x.layer(i)
        rope = model.rotary_local if layer.is_sliding else model.rotary_global
        attn = attention(b, layer.self_attn, x.input_norm(layer.input_layernorm),
                         _attn_of(bind, i), rope)  # fmt: skip
        b.norm(layer.post_attention_layernorm, attn, attn)  # in place
        h = x.add_norm(layer.pre_feedforward_layernorm, attn)
        out = _mlp(b, h, layer.mlp.gate_up, layer.mlp.kernel_act, layer.mlp.down_proj)
        x.pending = b.norm(layer.post_feedforward_layernorm, out, out)
    return x.plan(model)


def plan_qwen3(b: ProgramBuilder, model: Any, bind: Bindings) -> Plan:
    x = _Stream(b, model.config.hidden_size)
    for i, layer in enumerate(model.model.layers):
        x.layer(i)
        h = x.input_norm(layer.input_layernorm)
        attn = attention(b, layer.self_attn, h, _attn_of(bind, i), model.rotary)
        h = x.add_norm(layer.post_attention_layernorm, attn)
        x.pending = _mlp(b, h, layer.mlp.gate_up, layer.mlp.kernel_act, layer.mlp.down_proj)
    return x.plan(model)


def plan_granite(b: ProgramBuilder, model: Any, bind: Bindings) -> Plan:
    x = _Stream(b, model.config.hidden_size)
    for i, layer in enumerate(model.model.layers):
        x.layer(i)
        if layer.has_experts:
            raise Unsupported("Granite MoE experts (top-k routing runs in torch)")
        h = x.input_norm(layer.input_layernorm)
        if layer.is_mamba:
            if i not in bind.states:
                raise Unsupported(f"layer {i} has no state slots")
            states, group = bind.states[i]
            mixed = mamba(b, layer.mamba, h, states, group)
        else:
            mixed = attention(b, layer.self_attn, h, _attn_of(bind, i), model.rotary)
        h = x.add_norm(layer.post_attention_layernorm, mixed, layer.residual_multiplier)
        mlp = layer.shared_mlp
        x.pending = _mlp(b, h, mlp.input_linear, mlp.kernel_act, mlp.output_linear)
        x.scale = layer.residual_multiplier
    return x.plan(model)


Planner = Callable[[ProgramBuilder, Any, Bindings], Plan]
PLANS: dict[type[CausalLM], Planner] = {
    Gemma3ForCausalLM: plan_gemma3,
    Gemma3ForConditionalGeneration: plan_gemma3,
    GraniteMoeHybridForCausalLM: plan_granite,
    Qwen3ForCausalLM: plan_qwen3,
}

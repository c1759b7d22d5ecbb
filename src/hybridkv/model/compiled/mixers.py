"""The token mixers of a decode program: paged attention (``SelfAttention``) and the Mamba2
decode step (``Mamba2Mixer``), each as the kernel calls their Python decode step makes.

Attention (``models/common.py``): one GEMM into ``qkv`` ``[T, (H + 2 KV) d]``; the q and k
heads side by side normalised and rotated in place (``NORM_ROPE``, or ``ROPE`` alone); the
kernel reads q, k, v as columns of ``qkv`` and writes ``[T, H d]``; then ``o_proj``.
Mamba2 (``layers/mamba2.py``, decode only): ``in_proj`` into ``[T, inner + C + H]``, the
fused step with its gated norm into ``[T, inner]``, then ``out_proj``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridkv.model.compiled.builder import ProgramBuilder, Rows, Unsupported, page_dtype_code
from hybridkv.model.config.model_config import MambaOutNorm
from hybridkv.model.layers.mamba2 import Mamba2Mixer
from hybridkv.model.layers.rotary import RotaryTable
from hybridkv.model.models.common import SelfAttention
from hybridkv.native.runner import OpKind


@dataclass(frozen=True, slots=True)
class AttnBinding:
    """Where one attention layer's K/V live: its pages and its group's slot in the step."""

    pages: torch.Tensor  # [N, 2, B, kv_heads, d]
    group: int


def attention(
    b: ProgramBuilder, attn: SelfAttention, x: Rows, at: AttnBinding, rope: RotaryTable | None
) -> Rows:
    heads, kv, d = attn.num_heads, attn.attn.num_kv_heads, attn.head_dim
    qkv = b.linear(x, attn.qkv)  # [T, (heads + 2 kv) d]
    qk_geometry = (heads + kv, d, qkv.stride)
    tables = (None, None) if rope is None else (rope.cos, rope.sin)
    rot = 0 if rope is None else int(rope.cos.shape[1])
    if rope is not None:
        b.pin(rope.cos, "rotary table")
        b.pin(rope.sin, "rotary table")  # signed: its first half negated
    if attn.qk_norm is not None:
        if rope is None:
            raise Unsupported("q/k norms without RoPE")
        qk_scale = b.pin(attn.qk_norm.scale_rows().contiguous(), "q/k norm weight")
        args = (qkv.address, None, qk_scale, None, *(t.data_ptr() for t in tables))  # type: ignore[union-attr]
        eps = float(attn.qk_norm.q_norm.eps)
        b.emit(OpKind.NORM_ROPE, args, (*qk_geometry, heads + kv, rot), (eps,))
    elif rope is not None:
        args = (qkv.address, None, None, None, *(t.data_ptr() for t in tables))  # type: ignore[union-attr]
        b.emit(OpKind.ROPE, args, (*qk_geometry, 0, rot))
    pages, out = at.pages, b.buffer(heads * d)
    if pages.dim() != 5 or tuple(pages.shape[2:]) != (pages.shape[2], kv, d):
        raise Unsupported(f"KV pages {tuple(pages.shape)} for {kv} heads of {d}")
    block = int(pages.shape[2])
    if pages.stride()[1:] != (block * kv * d, kv * d, d, 1):
        raise Unsupported("KV pages whose page is not one contiguous run")
    sinks = None if attn.sinks is None else b.pin(attn.sinks.detach().float().contiguous(), "sinks")
    q, k, v = qkv.address, qkv.address + 4 * heads * d, qkv.address + 4 * (heads + kv) * d
    args = (q, k, v, out.address, pages.data_ptr(), sinks)
    geometry = (heads, kv, d, block, pages.stride(0), page_dtype_code(pages))
    strides = (qkv.stride,) * 3
    scale, softcap = float(attn.attn.scale), float(attn.attn.softcap or 0.0)
    b.emit(OpKind.ATTN, args, (*geometry, *strides, at.group), (scale, softcap))
    return b.linear(out, attn.o_proj)


def mamba(
    b: ProgramBuilder, mixer: Mamba2Mixer, x: Rows, states: tuple[torch.Tensor, ...], group: int
) -> Rows:
    cfg = mixer.cfg
    if mixer.proj_scale is not None or cfg.out_norm is MambaOutNorm.GATE_ONLY:
        raise Unsupported("a Mamba2 mixer with a projection scale or without its gated norm")
    step = mixer.step_weights()
    if step is None or step.norm is None:
        raise Unsupported("a Mamba2 mixer the decode kernel does not take")
    conv_states, ssm_states = states
    num_slots, heads, p_dim, n_dim = ssm_states.shape
    inner, w = heads * p_dim, step.weights
    channels, k = int(w.conv_w.shape[0]), int(w.conv_w.shape[-1])
    groups = (channels - inner) // (2 * n_dim)
    if conv_states.shape != (num_slots, channels, k - 1) or groups < 1 or heads % groups:
        raise Unsupported(f"Mamba2 states {tuple(conv_states.shape)} for {channels} channels")
    proj = b.linear(x, mixer.in_proj)  # [T, inner + C + heads]
    if proj.width != inner + channels + heads:
        raise Unsupported(f"Mamba2 projection of {proj.width} columns")
    scratch = b.buffer(channels + heads + inner)  # silu(conv) | dt | y before the norm
    y = b.buffer(inner)
    state_ptrs = [b.pin(t, "Mamba2 state") for t in (conv_states, ssm_states)]
    params = [w.conv_w, w.conv_b, w.dt_bias, w.a, w.d]
    addresses = [None if t is None else b.pin(t, "Mamba2 weight") for t in params]
    norm_w = b.pin(step.norm.weight, "Mamba2 norm weight")
    args = (*state_ptrs, proj.address, *addresses, scratch.address, y.address, norm_w)
    sizes = (proj.stride, inner, inner + channels, y.stride, num_slots, heads, groups,
             p_dim, n_dim, k, step.norm.groups, int(step.norm.gate_first), group)  # fmt: skip
    b.emit(OpKind.MAMBA, args, sizes, (*w.dt_limits, step.norm.eps))
    return b.linear(y, mixer.out_proj)

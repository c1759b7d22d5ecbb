"""Pieces every architecture shares: the attention block and the causal-LM shell."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.config.model_config import ModelConfig
from hybridkv.model.layers.attention import PagedAttention
from hybridkv.model.layers.fused import FusedLinear
from hybridkv.model.layers.linear import Linear, tensor_version
from hybridkv.model.layers.norm import OffsetRMSNorm, RMSNorm, row_kernels
from hybridkv.model.layers.rotary import RotaryCosSin
from hybridkv.model.layers.step_context import StepContext


class SelfAttention(nn.Module):
    """q/k/v projections, optional per-head q/k norms, RoPE, paged attention, output proj.

    q, k and v come out of one matmul (``FusedLinear``); q and k stay side by side
    (``[T, heads + kv_heads, d]``) through the norms and RoPE, which then run once.
    """

    def __init__(
        self,
        layer_id: int,
        cfg: ModelConfig,
        scale: float,
        qk_norm: type[RMSNorm | OffsetRMSNorm] | None = None,
        softcap: float | None = None,
        sinks: bool = False,
    ) -> None:
        super().__init__()
        heads, kv_heads, d = cfg.num_attention_heads, cfg.num_kv_heads, cfg.head_dim
        bias = bool(cfg.raw.get("attention_bias", False))
        self.q_proj = Linear(cfg.hidden_size, heads * d, bias=bias)
        self.k_proj = Linear(cfg.hidden_size, kv_heads * d, bias=bias)
        self.v_proj = Linear(cfg.hidden_size, kv_heads * d, bias=bias)
        self.o_proj = Linear(heads * d, cfg.hidden_size, bias=bias)
        self.qkv = FusedLinear([self.q_proj, self.k_proj, self.v_proj])
        self.qk_norm: _JointQKNorm | None = None
        if qk_norm is not None:
            self.q_norm = qk_norm(d, cfg.rms_norm_eps)
            self.k_norm = qk_norm(d, cfg.rms_norm_eps)
            self.qk_norm = _JointQKNorm(self.q_norm, self.k_norm, heads, kv_heads)
        self.num_heads = heads
        self.head_dim = d
        self.attn = PagedAttention(layer_id, heads, kv_heads, d, scale, softcap)
        self.sinks = nn.Parameter(torch.zeros(heads)) if sinks else None  # gpt-oss

    def forward(self, x: torch.Tensor, rope: RotaryCosSin | None, ctx: StepContext) -> torch.Tensor:
        qkv = self.qkv(x).view(x.shape[0], -1, self.head_dim)  # [T, heads + 2 * kv_heads, d]
        num_qk = qkv.shape[1] - self.attn.num_kv_heads
        qk, v = qkv[:, :num_qk], qkv[:, num_qk:]  # [T, heads + kv_heads, d], [T, kv_heads, d]
        if self.qk_norm is not None:
            qk = self.qk_norm(qk, rope)  # normalised, then rotated if rope is given
        elif rope is not None:
            qk = rope.apply(qk)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        out: torch.Tensor = self.o_proj(self.attn(q, k, v, ctx, self.sinks))  # [T, hidden]
        return out


class _JointQKNorm:
    """The q and k norms of one layer over ``[T, heads + kv_heads, d]`` in one pass: each
    head row normalised, then scaled by its own norm's weight (``[heads + kv_heads, d]``,
    rebuilt when a weight tensor changes)."""

    def __init__(
        self, q_norm: RMSNorm | OffsetRMSNorm, k_norm: RMSNorm | OffsetRMSNorm, heads: int, kv: int
    ) -> None:
        self.q_norm, self.k_norm = q_norm, k_norm
        self.heads, self.kv_heads = heads, kv
        self._key: tuple[object, ...] = ()
        self._scale = torch.empty(0)

    def __call__(self, qk: torch.Tensor, rope: RotaryCosSin | None = None) -> torch.Tensor:
        """The norms of ``qk``, then ``rope`` applied if given: float32 ``qk`` with packed
        heads (a view into the step's own q/k/v projection) is normalised and rotated in place
        by one native call."""
        kernels = row_kernels(qk)
        if kernels is not None and self.q_norm.weight.dtype == torch.float32:
            native = rope.native if rope is not None else None
            if native is not None and qk.stride(2) == 1 and qk.stride(1) == qk.shape[2]:
                return kernels.rms_norm_rope_(
                    qk, self._rows(), self.q_norm.eps, native.cos, native.signed_sin,
                    native.positions,
                )  # fmt: skip
            normed = kernels.rms_norm(qk, self._rows(), self.q_norm.eps)
        else:
            normed = F.rms_norm(qk.float(), qk.shape[-1:], eps=self.q_norm.eps)  # float32
            normed = self.q_norm.apply_scale(normed, self._rows(), qk.dtype)
        return normed if rope is None else rope.apply(normed)

    def scale_rows(self) -> torch.Tensor:
        """The per-row scales the kernel multiplies by, ``[heads + kv_heads, d]``."""
        return self._rows()

    def _rows(self) -> torch.Tensor:
        wq, wk = self.q_norm.weight, self.k_norm.weight
        key = (wq.data_ptr(), wk.data_ptr(), wq.dtype, tensor_version(wq), tensor_version(wk))
        if key != self._key:
            with torch.inference_mode(False), torch.no_grad():
                q_rows = self.q_norm.scale().expand(self.heads, -1)
                k_rows = self.k_norm.scale().expand(self.kv_heads, -1)
                self._scale = torch.cat([q_rows, k_rows])  # [heads + kv_heads, d]
            self._key = key
        return self._scale


class CausalLM(nn.Module):
    """The runner's view of a model: hidden states for the flat tokens, then logits."""

    config: ModelConfig
    lm_head: Linear
    # (our prefix, checkpoint prefix): other places the checkpoint may keep our weights
    checkpoint_prefixes: tuple[tuple[str, str], ...] = ()
    # checkpoint tensors deliberately not loaded (a vision tower); one log line says how many
    ignored_prefixes: tuple[str, ...] = ()

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """``[T]`` token ids -> final hidden states ``[T, hidden]``."""
        raise NotImplementedError

    def embed_input(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[T]`` token ids -> the residual stream's first value ``[T, hidden]``."""
        out: torch.Tensor = self.embedding()(input_ids)
        return out

    def embedding(self) -> nn.Embedding:
        """The input embedding (``lm_head`` shares its weight when tied)."""
        emb = self.get_submodule("model.embed_tokens")  # every family's ``self.model``
        if not isinstance(emb, nn.Embedding):
            raise TypeError(f"{type(self).__name__}: model.embed_tokens is not an nn.Embedding")
        return emb

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, hidden]`` -> float32 logits ``[n, vocab]`` (model-specific scaling applied)."""
        logits: torch.Tensor = self.lm_head(hidden)
        return logits.float()

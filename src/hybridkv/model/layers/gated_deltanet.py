"""Gated DeltaNet mixer (Qwen3-Next, Qwen3.5) on paged state slots.

State of one layer in one slot: the short conv's last inputs ``[conv_dim, d_conv - 1]`` and
the recurrent state ``[v_heads, dk, dv]`` (float32). Decode requests take one recurrent step;
prefill chunks are right-padded to ``[R, L]`` and run the chunked gated delta rule from the
slot's state (padding gets ``beta = 0, g = 0``: it neither decays nor writes the state).

Projections: Qwen3-Next packs q, k, v, z per key-head group in ``in_proj_qkvz`` (and b, a in
``in_proj_ba``); Qwen3.5 has ``in_proj_qkv`` (q, k, v contiguous), ``in_proj_z``,
``in_proj_b``, ``in_proj_a``. Both become contiguous ``qkv [T, conv_dim]``, ``z``, ``b``, ``a``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.config.gdn import GdnConfig
from hybridkv.model.layers.delta_rule import (
    chunk_gated_delta_rule,
    gated_delta_step_,
    l2_normalize,
)
from hybridkv.model.layers.linear import Linear
from hybridkv.model.layers.short_conv import conv_chunk_, conv_step_
from hybridkv.model.layers.step_context import StateMeta, StepContext

CHUNK = 64  # tokens per block of the chunked rule (transformers' reference uses 64)


class GatedDeltaNet(nn.Module):
    def __init__(
        self, layer_id: int, hidden: int, cfg: GdnConfig, eps: float, packed: bool
    ) -> None:
        super().__init__()
        self.layer_id, self.cfg, self.eps, self.packed = layer_id, cfg, eps, packed
        heads_v = cfg.num_v_heads
        if packed:
            self.in_proj_qkvz = Linear(hidden, cfg.conv_dim + cfg.value_dim, bias=False)
            self.in_proj_ba = Linear(hidden, 2 * heads_v, bias=False)
        else:
            self.in_proj_qkv = Linear(hidden, cfg.conv_dim, bias=False)
            self.in_proj_z = Linear(hidden, cfg.value_dim, bias=False)
            self.in_proj_b = Linear(hidden, heads_v, bias=False)
            self.in_proj_a = Linear(hidden, heads_v, bias=False)
        self.conv1d = nn.Conv1d(
            cfg.conv_dim, cfg.conv_dim, cfg.d_conv, groups=cfg.conv_dim, bias=False
        )
        self.dt_bias = nn.Parameter(torch.ones(heads_v))
        self.A_log = nn.Parameter(torch.zeros(heads_v))
        self.norm = _HeadNorm(cfg.head_v_dim, eps)
        self.out_proj = Linear(cfg.value_dim, hidden, bias=False)

    def forward(self, hidden: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """``[T, hidden]`` -> ``[T, hidden]``; updates this layer's live state slots."""
        conv_state, rec_state = ctx.states[self.layer_id]
        meta = ctx.state_meta[self.layer_id]
        qkv, z, b, a = self._project(hidden)
        cfg = self.cfg
        y = hidden.new_empty(hidden.shape[0], cfg.num_v_heads, cfg.head_v_dim, dtype=torch.float32)
        if meta.has_decode:
            y[meta.decode_token_idx] = self._decode(qkv, b, a, conv_state, rec_state, meta)
        if meta.has_prefill:
            y[meta.prefill_token_idx] = self._prefill(qkv, b, a, conv_state, rec_state, meta)
        normed = self.norm(y, z.view(y.shape)).flatten(1).to(hidden.dtype)
        out: torch.Tensor = self.out_proj(normed)
        return out

    def _project(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """-> qkv ``[T, conv_dim]``, z ``[T, value_dim]``, b and a ``[T, v_heads]``."""
        if not self.packed:
            return (
                self.in_proj_qkv(hidden),
                self.in_proj_z(hidden),
                self.in_proj_b(hidden),
                self.in_proj_a(hidden),
            )
        cfg, n = self.cfg, hidden.shape[0]
        per = cfg.num_v_heads // cfg.num_k_heads * cfg.head_v_dim  # v (and z) per key head
        groups = self.in_proj_qkvz(hidden).view(n, cfg.num_k_heads, -1)
        q, k, v, z = groups.split([cfg.head_k_dim, cfg.head_k_dim, per, per], dim=-1)
        qkv = torch.cat([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], dim=-1)
        b, a = self.in_proj_ba(hidden).view(n, cfg.num_k_heads, -1).chunk(2, dim=-1)
        return qkv, z.reshape(n, -1), b.reshape(n, -1), a.reshape(n, -1)

    def _heads(self, conv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv outputs ``[..., conv_dim]`` -> q, k ``[..., v_heads, dk]`` (normalised, q
        scaled, repeated over the value heads of their group), v ``[..., v_heads, dv]``."""
        cfg = self.cfg
        x = F.silu(conv.float())
        q, k, v = torch.split(x, [cfg.key_dim, cfg.key_dim, cfg.value_dim], dim=-1)
        lead = x.shape[:-1]
        q = l2_normalize(q.view(*lead, cfg.num_k_heads, cfg.head_k_dim)) * cfg.head_k_dim**-0.5
        k = l2_normalize(k.view(*lead, cfg.num_k_heads, cfg.head_k_dim))
        if cfg.num_v_heads != cfg.num_k_heads:
            repeat = cfg.num_v_heads // cfg.num_k_heads
            q, k = q.repeat_interleave(repeat, dim=-2), k.repeat_interleave(repeat, dim=-2)
        return q, k, v.view(*lead, cfg.num_v_heads, cfg.head_v_dim)

    def _gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> log decay ``g`` and write strength ``beta``, float32."""
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        return g, b.float().sigmoid()

    def _decode(
        self,
        qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        conv_state: torch.Tensor,
        rec_state: torch.Tensor,
        meta: StateMeta,
    ) -> torch.Tensor:
        idx = meta.decode_token_idx
        live = meta.decode_slot_run or meta.decode_slots
        q, k, v = self._heads(conv_step_(qkv[idx], conv_state, live, self.conv1d))
        g, beta = self._gates(b[idx], a[idx])
        state = rec_state[live]  # [Rd, h, dk, dv]: a view for a run of slots
        y = gated_delta_step_(q, k, v, g, beta, state)
        if meta.decode_slot_run is None:
            rec_state[live] = state
        return y

    def _prefill(
        self,
        qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        conv_state: torch.Tensor,
        rec_state: torch.Tensor,
        meta: StateMeta,
    ) -> torch.Tensor:
        slots, valid, gather = meta.prefill_slots, meta.prefill_valid, meta.prefill_gather
        pad = ~valid[..., None]  # NOTE: masked_fill, not `* valid`: NaN must not cross rows
        padded = qkv[gather].masked_fill(pad, 0.0)  # [Rp, L, conv_dim]
        taps = meta.taps
        conv = conv_chunk_(padded, conv_state, slots, meta.prefill_lens, self.conv1d, taps)
        q, k, v = (t.masked_fill(pad[..., None], 0.0) for t in self._heads(conv))
        g, beta = (t.masked_fill(pad, 0.0) for t in self._gates(b[gather], a[gather]))
        at = None if taps is None else (taps.rows, taps.lens)
        y, final, tapped = chunk_gated_delta_rule(q, k, v, g, beta, rec_state[slots], CHUNK, at)
        rec_state[slots] = final
        if taps is not None and tapped is not None:  # checkpoints due inside the chunk
            rec_state[taps.slots] = tapped.to(rec_state.dtype)
        return y[valid]  # [sum(lens), h, dv]


class _HeadNorm(nn.Module):
    """Per value head: RMS-normalise, scale by ``weight``, then gate by ``silu(z)``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(y.float(), y.shape[-1:], eps=self.eps)
        return self.weight.float() * normed * F.silu(z.float())

"""Mamba2 mixer on paged state slots.

State of one layer in one slot: ``conv [conv_dim, d_conv - 1]`` (the last inputs of the
causal conv) and ``ssm [heads, head_dim, d_state]`` (float32). Decode requests take one
recurrent step; prefill chunks are padded to ``[R, L]`` and run the chunked scan starting from
the slot's state, so a chunk that continues a previous one (or a restored checkpoint) gives
the same result as one long prefill. States at checkpoint boundaries inside a chunk
(``StateMeta.taps``) come out of the same scan: the conv inputs before the boundary and the
SSM state there are written into the checkpoint slots during the forward. Padding gets ``dt = 0``: it neither decays nor feeds the
state.

Variants: ``MambaConfig.out_norm`` says how the scan output meets the gate (Falcon-H1 may skip
the norm or normalise before gating), ``proj_scale`` multiplies the input projection per
channel (Falcon-H1's MuP vector; None elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.config.model_config import MambaConfig, MambaOutNorm
from hybridkv.model.layers.linear import Linear, tensor_version
from hybridkv.model.layers.norm import GatedRMSNorm
from hybridkv.model.layers.short_conv import conv_chunk_, conv_step_
from hybridkv.model.layers.ssd import ssd_chunk_scan, ssd_step_
from hybridkv.model.layers.step_context import StateMeta, StepContext
from hybridkv.native.ssm import MambaWeights, SsmKernels, StepNorm, load_ssm
from hybridkv.native.ssm_prefill import PrefillRows, load_ssm_prefill


@dataclass(frozen=True, slots=True)
class NativeStep:
    """The decode kernel and one mixer's parameters as it takes them; ``norm`` None: the
    mixer's output norm is not one the kernel applies (gate only)."""

    kernels: SsmKernels
    weights: MambaWeights
    norm: StepNorm | None


class Mamba2Mixer(nn.Module):
    def __init__(self, layer_id: int, hidden: int, cfg: MambaConfig, eps: float) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.cfg = cfg
        inner, conv_dim = cfg.intermediate_size, cfg.conv_dim
        self.in_proj = Linear(hidden, inner + conv_dim + cfg.num_heads, bias=cfg.proj_bias)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, cfg.d_conv, groups=conv_dim, bias=cfg.conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(cfg.num_heads))
        self.A_log = nn.Parameter(torch.zeros(cfg.num_heads))
        self.D = nn.Parameter(torch.ones(cfg.num_heads))
        if cfg.out_norm is not MambaOutNorm.GATE_ONLY:
            before = cfg.out_norm is MambaOutNorm.NORM_THEN_GATE
            self.norm = GatedRMSNorm(inner, cfg.n_groups, eps, norm_before_gate=before)
        self.out_proj = Linear(inner, hidden, bias=cfg.proj_bias)
        self.proj_scale: torch.Tensor | None = None  # [inner + conv_dim + heads]
        self._step_key: tuple[tuple[int, int], ...] = ()
        self._step: NativeStep | None = None

    def forward(self, hidden: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """``[T, hidden]`` -> ``[T, hidden]``; updates this layer's live state slots."""
        conv_state, ssm_state = ctx.states[self.layer_id]
        meta = ctx.state_meta[self.layer_id]
        cfg = self.cfg
        proj = self.in_proj(hidden)  # [T, inner + conv_dim + heads]
        if self.proj_scale is not None:
            proj = proj * self.proj_scale.to(proj.dtype)
        y = hidden.new_empty(hidden.shape[0], cfg.intermediate_size)  # [T, inner]
        step = self._native_step(proj, conv_state, ssm_state) if meta.has_decode else None
        if step is not None:  # the decode rows in one call (native/ssm.c)
            norm = None if meta.has_prefill else step.norm  # decode only: the norm in the step
            states, slots, tokens = (
                (conv_state, ssm_state),
                meta.decode_slots,
                meta.decode_token_idx,
            )
            step.kernels.mamba_step_(states, slots, tokens, proj, step.weights, y, norm)
            if norm is not None:  # y went through the gated norm inside the step
                normed: torch.Tensor = self.out_proj(y)
                return normed
        gate, xbc, dt = proj.split([cfg.intermediate_size, cfg.conv_dim, cfg.num_heads], dim=-1)
        if step is None and meta.has_decode:
            y[meta.decode_token_idx] = self._decode(xbc, dt, conv_state, ssm_state, meta)
        if meta.has_prefill and not self._prefill_native(xbc, dt, conv_state, ssm_state, meta, y):
            y[meta.prefill_token_idx] = self._prefill(xbc, dt, conv_state, ssm_state, meta)
        if self.cfg.out_norm is MambaOutNorm.GATE_ONLY:
            gated = (y.float() * F.silu(gate.float())).to(y.dtype)
            out: torch.Tensor = self.out_proj(gated)
        else:
            out = self.out_proj(self.norm(y, gate, scratch=True))
        return out

    def _decode(
        self,
        xbc: torch.Tensor,
        dt: torch.Tensor,
        conv_state: torch.Tensor,
        ssm_state: torch.Tensor,
        meta: StateMeta,
    ) -> torch.Tensor:
        """The decode rows' step in torch (the fallback and the native kernel's reference)."""
        idx = meta.decode_token_idx
        # a contiguous run of slots is updated in place through a view; else gather/scatter
        live = meta.decode_slot_run or meta.decode_slots
        conv = conv_step_(xbc[idx], conv_state, live, self.conv1d)  # [Rd, conv_dim]
        x, b, c = self._split_heads(F.silu(conv))  # [Rd, h, p], [Rd, h, n], [Rd, h, n]
        step_dt = self._dt(dt[idx])  # [Rd, h]
        state = ssm_state[live]  # [Rd, h, p, n]: a view for a run of slots
        y = ssd_step_(x, step_dt, self._a(), b, c, state)
        if meta.decode_slot_run is None:
            ssm_state[live] = state
        y = y + x * self.D.float()[:, None]  # [Rd, h, p]
        return y.flatten(1).to(xbc.dtype)

    def _native_step(
        self, proj: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor
    ) -> NativeStep | None:
        """The decode kernel with this mixer's parameters, or None where it does not apply
        (no kernel, autograd, not float32): the mixer then runs ``_decode``. Built once and
        kept while the parameters are unchanged (same tensors, same versions)."""
        kernels = None if torch.is_grad_enabled() else load_ssm()
        tensors = (proj, conv_state, ssm_state)
        if kernels is None or any(t.dtype != torch.float32 for t in tensors):
            return None
        params = self._step_params()
        key = tuple((p.data_ptr(), tensor_version(p)) for p in params)
        if key != self._step_key:
            self._step, self._step_key = self._build_step(kernels, params), key
        return self._step

    def step_weights(self) -> NativeStep | None:
        """The decode kernel and this mixer's parameters as ``_native_step`` builds them (for
        a decode program, ``model/compiled``); None where the kernel does not apply."""
        kernels = None if torch.is_grad_enabled() else load_ssm()
        return None if kernels is None else self._build_step(kernels, self._step_params())

    def _step_params(self) -> list[torch.Tensor]:
        """The parameters the decode kernel reads (not the projections')."""
        params = [self.conv1d.weight, self.dt_bias, self.A_log, self.D]
        if self.conv1d.bias is not None:
            params.append(self.conv1d.bias)
        if self.cfg.out_norm is not MambaOutNorm.GATE_ONLY:
            params.append(self.norm.weight)
        return params

    def _build_step(self, kernels: SsmKernels, params: list[torch.Tensor]) -> NativeStep | None:
        if any(p.dtype != torch.float32 for p in params):
            return None
        conv_w = self.conv1d.weight[:, 0, :]  # [conv_dim, k]
        limits = (self.cfg.dt_min, self.cfg.dt_max)
        a = self._a().contiguous()
        weights = MambaWeights(conv_w, self.conv1d.bias, self.dt_bias, a, self.D, limits)
        norm = None
        if self.cfg.out_norm is not MambaOutNorm.GATE_ONLY:
            gated = self.norm
            norm = StepNorm(gated.weight, gated.num_groups, gated.eps, not gated.norm_before_gate)
        return NativeStep(kernels, weights, norm)

    def _prefill_native(
        self,
        xbc: torch.Tensor,
        dt: torch.Tensor,
        conv_state: torch.Tensor,
        ssm_state: torch.Tensor,
        meta: StateMeta,
        y: torch.Tensor,
    ) -> bool:
        """The prefill rows through ``native/ssm_prefill.c`` (conv + SiLU, then the scan token
        by token), reading and writing the slots in place and ``y``'s prefill tokens directly;
        False (nothing done) where it does not apply: no kernels, autograd, not float32."""
        kernels = None if torch.is_grad_enabled() else load_ssm_prefill()
        tensors = (xbc, conv_state, ssm_state, y)
        if kernels is None or any(t.dtype != torch.float32 for t in tensors):
            return False
        taps = meta.taps
        rows = PrefillRows(
            meta.prefill_gather[:, 0].contiguous(),  # each row's tokens are contiguous
            meta.prefill_lens,
            meta.prefill_slots,
            None if taps is None else (taps.rows, taps.lens, taps.slots),
        )
        w = self.conv1d.weight[:, 0, :].contiguous()  # [conv_dim, k]
        # silu(conv) over xbc's prefill rows in place: the projection is this call's own
        act = kernels.conv_chunk_(conv_state, rows, xbc, w, self.conv1d.bias, in_place=True)
        a, d = self._a(), self.D.float()
        kernels.ssd_scan_(ssm_state, rows, act, self._dt(dt), a, d, self.cfg.n_groups, y)
        return True

    def _prefill(
        self,
        xbc: torch.Tensor,
        dt: torch.Tensor,
        conv_state: torch.Tensor,
        ssm_state: torch.Tensor,
        meta: StateMeta,
    ) -> torch.Tensor:
        slots, valid = meta.prefill_slots, meta.prefill_valid
        # NOTE: padding gathers some other request's token; masked_fill (not `* valid`) so a
        # NaN there (a request computing on a failed load) cannot leak into this row.
        pad = ~valid[..., None]
        padded = xbc[meta.prefill_gather].masked_fill(pad, 0.0)  # [Rp, L, conv_dim]
        taps = meta.taps
        conv = conv_chunk_(padded, conv_state, slots, meta.prefill_lens, self.conv1d, taps)
        x, b, c = self._split_heads(F.silu(conv))  # [Rp, L, h, ...]
        scan_dt = self._dt(dt[meta.prefill_gather]).masked_fill(pad, 0.0)  # [Rp, L, h]
        y, final, tapped = ssd_chunk_scan(
            x,
            scan_dt,
            self._a(),
            b,
            c,
            ssm_state[slots],
            self.cfg.chunk_size,
            None if taps is None else (taps.rows, taps.lens),
        )
        ssm_state[slots] = final
        if taps is not None and tapped is not None:  # checkpoints due inside the chunk
            ssm_state[taps.slots] = tapped.to(ssm_state.dtype)
        y = y + x * self.D.float()[:, None]  # [Rp, L, h, p]
        return y[valid].flatten(1).to(xbc.dtype)  # [sum(lens), inner]

    def _split_heads(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[..., conv_dim]`` -> x ``[..., h, p]``, B and C ``[..., h, n]`` (float32)."""
        cfg = self.cfg
        group_span = cfg.n_groups * cfg.d_state
        x, b, c = torch.split(xbc.float(), [cfg.intermediate_size, group_span, group_span], -1)
        per_group = cfg.num_heads // cfg.n_groups
        lead = x.shape[:-1]
        b = b.view(*lead, cfg.n_groups, cfg.d_state).repeat_interleave(per_group, dim=-2)
        c = c.view(*lead, cfg.n_groups, cfg.d_state).repeat_interleave(per_group, dim=-2)
        return x.view(*lead, cfg.num_heads, cfg.head_dim), b, c

    def _dt(self, dt: torch.Tensor) -> torch.Tensor:
        dt = F.softplus(dt.float() + self.dt_bias.float())
        return dt.clamp(self.cfg.dt_min, self.cfg.dt_max)

    def _a(self) -> torch.Tensor:
        return -torch.exp(self.A_log.float())  # [h]

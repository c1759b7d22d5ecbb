"""The Mamba2 decode step fused into one call (``ssm.c``): from the decode tokens' input
projection to the mixer's pre-norm output, conv and SSM state slots updated in place.

``load_ssm()`` builds the C source like the other kernels (``hybridkv.native``) and returns
None where that is impossible or ``HYBRIDKV_NATIVE=0``; the mixer then runs its torch step
(``Mamba2Mixer._decode_torch``: ``short_conv.conv_step_`` + ``ssd.ssd_step_``), which is also
the kernel's test reference.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from hybridkv.native import load_library

SOURCE = Path(__file__).with_name("ssm.c")
_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _MambaStep(ctypes.Structure):
    """``MambaStep`` of ``ssm.c``, field for field."""

    _fields_ = [
        (name, _P)
        for name in (
            "conv_states",
            "ssm_states",
            "slots",
            "tokens",
            "proj",
            "conv_w",
            "conv_b",
            "dt_bias",
            "a",
            "d",
            "act",
            "dts",
            "ys",
            "y",
            "norm_w",
        )
    ]
    _fields_ += [
        (name, _I64)
        for name in ("proj_stride", "xbc_at", "dt_at", "y_stride", "rows", "num_slots")
        + ("num_tokens", "heads", "groups", "p_dim", "n_dim", "k", "norm_groups", "gate_first")
    ]
    _fields_ += [("dt_lo", _F32), ("dt_hi", _F32), ("eps", _F32)]


@dataclass(frozen=True, slots=True)
class MambaWeights:
    """One mixer's step parameters, float32 contiguous (checked here, once): conv weight
    ``[C, k]`` and bias ``[C]`` or None; dt_bias, a (``-exp(A_log)``) and D ``[h]`` (D may be
    None); the dt clamp."""

    conv_w: torch.Tensor
    conv_b: torch.Tensor | None
    dt_bias: torch.Tensor
    a: torch.Tensor
    d: torch.Tensor | None
    dt_limits: tuple[float, float]

    def __post_init__(self) -> None:
        channels, heads = self.conv_w.shape[0], self.dt_bias.shape[0]
        _check_f32("conv weight", self.conv_w, (channels, self.conv_w.shape[-1]))
        _check_f32("conv bias", self.conv_b, (channels,))
        for name, t in (("dt_bias", self.dt_bias), ("a", self.a), ("d", self.d)):
            _check_f32(name, t, (heads,))


@dataclass(frozen=True, slots=True)
class StepNorm:
    """The gated RMS norm the step applies to y before writing it (``GatedRMSNorm``): weight
    ``[inner]`` float32, groups, eps, and whether the gate comes before the norm."""

    weight: torch.Tensor
    groups: int
    eps: float
    gate_first: bool

    def __post_init__(self) -> None:
        _check_f32("norm weight", self.weight, (self.weight.shape[0],))
        if self.groups < 1 or self.weight.shape[0] % self.groups:
            raise ValueError(f"norm: {self.weight.shape[0]} channels over {self.groups} groups")


def _check_f32(name: str, t: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    if t is not None and (
        t.dtype != torch.float32 or not t.is_contiguous() or tuple(t.shape) != shape
    ):
        raise ValueError(f"{name}: expected contiguous float32 {shape}, got {t.dtype}")


class SsmKernels:
    """The C kernel with the checks that keep it inside its buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._step = lib.hk_mamba_step
        self._step.argtypes = [ctypes.POINTER(_MambaStep)]
        self._step.restype = ctypes.c_int

    def mamba_step_(
        self,
        states: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        tokens: torch.Tensor,
        proj: torch.Tensor,
        weights: MambaWeights,
        y: torch.Tensor,
        norm: StepNorm | None = None,
    ) -> None:
        """Row r (token ``tokens[r]`` of ``proj`` ``[T, inner + C + h]``, gate | xbc | dt)
        continues from conv ``states[0][slots[r]]`` ``[C, k - 1]`` and SSM
        ``states[1][slots[r]]`` ``[h, p, n]`` (both updated in place) and writes its
        ``[inner]`` output to ``y[tokens[r]]`` (``y`` ``[T, inner]``), through ``norm`` with the
        token's gate (``proj``'s first ``inner`` columns) if given; float32."""
        conv_states, ssm_states = states
        num_slots, heads, p_dim, n_dim, channels, k, groups = _check_step(
            conv_states, ssm_states, slots, tokens, proj, weights, y, norm
        )
        inner, rows = heads * p_dim, slots.shape[0]
        # scratch: silu(conv) [R, C], dt [R, h], y before the norm [R, inner]
        act = torch.empty(rows * (channels + heads + (inner if norm else 0)), dtype=torch.float32)
        args = _MambaStep(
            *(_ptr(t) for t in (conv_states, ssm_states, slots, tokens, proj, weights.conv_w)),
            *(_ptr(t) for t in (weights.conv_b, weights.dt_bias, weights.a, weights.d, act)),
            act.data_ptr() + rows * channels * 4,
            act.data_ptr() + rows * (channels + heads) * 4,
            y.data_ptr(),
            None if norm is None else norm.weight.data_ptr(),
            proj.stride(0),
            inner,
            inner + channels,
            y.stride(0),
            rows,
            num_slots,
            proj.shape[0],
            heads,
            groups,
            p_dim,
            n_dim,
            k,
            1 if norm is None else norm.groups,
            int(norm is not None and norm.gate_first),
            *weights.dt_limits,
            1e-6 if norm is None else norm.eps,
        )
        if self._step(ctypes.byref(args)) != 0:
            raise IndexError(f"state slot or token out of range ({num_slots} slots)")


def _check_step(
    conv_states: torch.Tensor,
    ssm_states: torch.Tensor,
    slots: torch.Tensor,
    tokens: torch.Tensor,
    proj: torch.Tensor,
    weights: MambaWeights,
    y: torch.Tensor,
    norm: StepNorm | None,
) -> tuple[int, int, int, int, int, int, int]:
    """A step's buffers fit each other (ValueError naming the first that does not): what
    keeps the kernel inside them, apart from the slot and token values it checks itself.
    Returns the sizes: slots, heads, p, n, conv channels, conv kernel size, groups."""
    num_slots, heads, p_dim, n_dim = ssm_states.shape
    inner = heads * p_dim
    channels, k = weights.conv_w.shape[0], weights.conv_w.shape[-1]
    groups = (channels - inner) // (2 * n_dim)
    rows, num_tokens = slots.shape[0], proj.shape[0]
    _check_f32("conv states", conv_states, (num_slots, channels, k - 1))
    _check_f32("ssm states", ssm_states, (num_slots, heads, p_dim, n_dim))
    if weights.dt_bias.shape[0] != heads or (norm and norm.weight.shape[0] != inner):
        raise ValueError(f"weights do not fit {heads} heads of {p_dim}")
    for name, t in (("slots", slots), ("tokens", tokens)):
        if t.dtype != torch.int64 or t.shape != (rows,) or not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous int64 [{rows}]")
    if groups < 1 or heads % groups or channels != inner + 2 * groups * n_dim:
        raise ValueError(f"{channels} conv channels do not fit {heads} heads of {p_dim}")
    if proj.dtype != torch.float32 or proj.dim() != 2 or proj.stride(1) != 1:
        raise ValueError("proj must be float32 [T, inner + C + h] with contiguous rows")
    if proj.shape[1] != inner + channels + heads:
        raise ValueError(f"proj: {proj.shape[1]} columns, expected {inner + channels + heads}")
    if y.dtype != torch.float32 or y.shape != (num_tokens, inner) or y.stride(1) != 1:
        raise ValueError(f"y must be float32 [{num_tokens}, {inner}] with contiguous rows")
    return num_slots, heads, p_dim, n_dim, channels, k, groups


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@functools.cache
def load_ssm(isa: str | None = None) -> SsmKernels | None:
    """The Mamba2 decode kernel, built on first use; None (logged once) if it cannot be."""
    lib = load_library(SOURCE, "Mamba2 step", "using torch", isa)
    return None if lib is None else SsmKernels(lib)

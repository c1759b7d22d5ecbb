"""The Mamba2 decode step in one pass over the state, and its conv step, both in place through
the live slots' indices (``ssm.c``).

``load_ssm()`` builds the C source like the other kernels (``hybridkv.native``) and returns
None where that is impossible or ``HYBRIDKV_NATIVE=0``; the mixer then runs
``model/layers/ssd.py`` ``ssd_step_``, which is also the kernel's test reference.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from hybridkv.native import load_library

SOURCE = Path(__file__).with_name("ssm.c")


class SsmKernels:
    """The C kernel with the checks that keep it inside its buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self._step = lib.hk_ssd_step
        self._step.argtypes = [*[ptr] * 9, i64, i64, i64, i64, i64]
        self._step.restype = None
        self._conv = lib.hk_conv_step
        self._conv.argtypes = [ptr, ptr, ptr, i64, ptr, ptr, ptr, i64, i64, i64]
        self._conv.restype = None

    def conv_step_(
        self,
        states: torch.Tensor,
        slots: torch.Tensor,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """``short_conv.conv_step_`` in place through the slot indices: ``states``
        ``[S, C, k - 1]``, x ``[R, C]`` (rows contiguous), weight ``[C, k]``, bias ``[C]``
        -> conv outputs ``[R, C]``; float32."""
        rows, channels = x.shape
        k = weight.shape[1]
        want = {
            "states": (states, (states.shape[0], channels, k - 1)),
            "weight": (weight, (channels, k)),
        }
        if bias is not None:
            want["bias"] = (bias, (channels,))
        for name, (t, shape) in want.items():
            if t.dtype != torch.float32 or not t.is_contiguous() or tuple(t.shape) != shape:
                raise ValueError(f"{name}: expected contiguous float32 {shape}, got {t.dtype}")
        if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1:
            raise ValueError("x must be float32 [R, C] with contiguous rows")
        _check_slots(slots, rows, states.shape[0])
        out = torch.empty(rows, channels, dtype=torch.float32)
        self._conv(
            states.data_ptr(),
            slots.data_ptr(),
            x.data_ptr(),
            x.stride(0),
            weight.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            rows,
            channels,
            k,
        )
        return out

    def ssd_step_(
        self,
        states: torch.Tensor,
        slots: torch.Tensor,
        x: torch.Tensor,
        dt: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        c: torch.Tensor,
        d: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Row ``r``'s state is ``states[slots[r]]`` (``states`` ``[S, h, p, n]``, updated in
        place); x ``[R, h, p]``, dt ``[R, h]``, a and d ``[h]``, b/c ``[R, g, n]`` (heads
        ``h / g`` per group) -> y ``[R, h, p]`` (``S c + d x``); float32, contiguous."""
        _, heads, p_dim, n_dim = states.shape
        rows, groups = x.shape[0], b.shape[1]
        want = {
            "states": (states, tuple(states.shape)),
            "x": (x, (rows, heads, p_dim)),
            "dt": (dt, (rows, heads)),
            "a": (a, (heads,)),
            "b": (b, (rows, groups, n_dim)),
            "c": (c, (rows, groups, n_dim)),
        }
        if d is not None:
            want["d"] = (d, (heads,))
        for name, (t, shape) in want.items():
            if t.dtype != torch.float32 or not t.is_contiguous() or tuple(t.shape) != shape:
                raise ValueError(f"{name}: expected contiguous float32 {shape}, got {t.dtype}")
        if groups < 1 or heads % groups:
            raise ValueError(f"{heads} heads over {groups} groups")
        _check_slots(slots, rows, states.shape[0])
        y = torch.empty(rows, heads, p_dim, dtype=torch.float32)
        self._step(
            states.data_ptr(),
            slots.data_ptr(),
            x.data_ptr(),
            dt.data_ptr(),
            a.data_ptr(),
            None if d is None else d.data_ptr(),
            b.data_ptr(),
            c.data_ptr(),
            y.data_ptr(),
            rows,
            heads,
            groups,
            p_dim,
            n_dim,
        )
        return y


def _check_slots(slots: torch.Tensor, rows: int, num_slots: int) -> None:
    if slots.dtype != torch.int64 or slots.shape != (rows,) or not slots.is_contiguous():
        raise ValueError(f"slots must be contiguous int64 [{rows}]")
    if rows and (int(slots.min()) < 0 or int(slots.max()) >= num_slots):
        raise IndexError(f"state slot out of range [0, {num_slots})")


@functools.cache
def load_ssm() -> SsmKernels | None:
    """The Mamba2 decode kernel, built on first use; None (logged once) if it cannot be."""
    lib = load_library(SOURCE, "Mamba2 step", "using torch")
    return None if lib is None else SsmKernels(lib)

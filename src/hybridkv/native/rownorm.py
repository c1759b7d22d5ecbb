"""Row kernels of the decoder layers (``rownorm.c``): RMS norm with a fused residual add,
rotary embedding in place, and a gated MLP's ``act(gate) * up``, for float32 activations.

``load_rownorm()`` builds the C source like the other kernels (``hybridkv.native``) and returns
None where that is impossible or ``HYBRIDKV_NATIVE=0``; the layers then run their torch code
(``model/layers/norm.py``, ``rotary.py``), which is also the kernels' test reference. A decode
step of a small checkpoint makes ~40 norm and ~12 rotary calls: each torch version is 5-10 ops
of ~5-10 us dispatch apiece on 16 rows, each kernel one ctypes call.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from hybridkv.native import load_library

SOURCE = Path(__file__).with_name("rownorm.c")
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # act_mul's activations (hk_act_mul's codes)


class RowKernels:
    """The C kernels with the checks that keep them inside their buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self._norm = lib.hk_rms_norm
        self._norm.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr, i64, ptr, ctypes.c_float]
        self._norm.argtypes += [ctypes.c_float]
        self._norm.restype = None
        self._rope = lib.hk_rope
        self._rope.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr, i64, ptr]
        self._rope.restype = None
        self._norm_rope = lib.hk_rms_norm_rope
        self._norm_rope.argtypes = [ptr, i64, i64, i64, i64, ptr, i64, ctypes.c_float]
        self._norm_rope.argtypes += [ptr, ptr, i64, ptr]
        self._norm_rope.restype = None
        self._act_mul = lib.hk_act_mul
        self._act_mul.argtypes = [ptr, i64, i64, i64, i64, ptr]
        self._act_mul.restype = None

    def rms_norm(
        self,
        x: torch.Tensor,
        scale: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        x_scale: float = 1.0,
    ) -> torch.Tensor:
        """``rms_norm(v) * scale`` per row of ``x`` (``[T, dim]`` or ``[T, heads, dim]``), where
        ``v`` is the row, or with ``residual`` (contiguous, ``x``'s shape) ``residual += x``
        first (in place) and ``v`` the sum. ``scale``: ``[dim]`` or ``[rows, dim]`` (row ``r``
        of ``x``'s ``T * heads`` rows scaled by ``scale[r % rows]``). Into ``out`` (contiguous,
        may be ``residual``, or ``x`` if contiguous) or a new tensor. ``x_scale`` (with
        ``residual``): ``x.mul_(x_scale)`` first, in place (the same bits as torch's)."""
        tokens, heads, dim, token_stride = _rows(x)
        _check_scale(scale, dim)
        if x_scale != 1.0 and (residual is None or not x.is_contiguous()):
            raise ValueError("x_scale needs a residual and a contiguous x (scaled in place)")
        scale_rows = 1 if scale.dim() == 1 else scale.shape[0]
        for name, t in (("residual", residual), ("out", out)):
            if t is not None and (
                t.dtype != torch.float32 or not t.is_contiguous() or t.shape != x.shape
            ):
                raise ValueError(f"{name} must be contiguous float32 {tuple(x.shape)}")
        result = torch.empty(x.shape, dtype=torch.float32) if out is None else out
        self._norm(
            x.data_ptr(),
            tokens,
            heads,
            dim,
            token_stride,
            None if residual is None else residual.data_ptr(),
            scale.data_ptr(),
            scale_rows,
            result.data_ptr(),
            eps,
            x_scale,
        )
        return result

    def rope_(
        self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """Rotate the first ``cos.shape[1]`` elements of every head of ``x`` ``[T, heads, d]``
        in place by its token's position. ``cos``/``signed_sin``: ``[len, rot]`` contiguous
        tables (``RotaryTable``); ``positions``: ``[T]`` int64, contiguous, each ``< len``
        (checked once per step by the caller)."""
        tokens, heads, dim, token_stride = _rows(x)
        rot = _check_rope(cos, signed_sin, positions, tokens, dim)
        self._rope(
            x.data_ptr(),
            tokens,
            heads,
            dim,
            token_stride,
            cos.data_ptr(),
            signed_sin.data_ptr(),
            rot,
            positions.data_ptr(),
        )

    def rms_norm_rope_(
        self,
        x: torch.Tensor,
        scale: torch.Tensor,
        eps: float,
        cos: torch.Tensor,
        signed_sin: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """``rms_norm`` of every head row of ``x`` ``[T, heads, d]``, then ``rope_``, in one
        pass, in place (the same arithmetic as the two calls); returns ``x``."""
        tokens, heads, dim, token_stride = _rows(x)
        _check_scale(scale, dim)
        rot = _check_rope(cos, signed_sin, positions, tokens, dim)
        scale_rows = 1 if scale.dim() == 1 else scale.shape[0]
        self._norm_rope(
            x.data_ptr(),
            tokens,
            heads,
            dim,
            token_stride,
            scale.data_ptr(),
            scale_rows,
            eps,
            cos.data_ptr(),
            signed_sin.data_ptr(),
            rot,
            positions.data_ptr(),
        )
        return x

    def act_mul(self, gate_up: torch.Tensor, act: str) -> torch.Tensor:
        """``act(gate) * up`` from ``gate_up`` ``[T, 2 * inner]`` (halves in that order, rows
        contiguous) -> a new ``[T, inner]``; ``act``: one of ``ACTIVATIONS``."""
        if act not in ACTIVATIONS:
            raise ValueError(f"activation {act!r}: the kernel has {', '.join(ACTIVATIONS)}")
        tokens, _, width, stride = _rows(gate_up)
        if gate_up.dim() != 2 or width % 2:
            raise ValueError(f"gate_up must be [T, 2 * inner], got {tuple(gate_up.shape)}")
        out = torch.empty(tokens, width // 2, dtype=torch.float32)
        self._act_mul(
            gate_up.data_ptr(), tokens, width // 2, stride, ACTIVATIONS[act], out.data_ptr()
        )
        return out


def _check_scale(scale: torch.Tensor, dim: int) -> None:
    if scale.dtype != torch.float32 or not scale.is_contiguous() or scale.shape[-1] != dim:
        raise ValueError(f"scale {scale.dtype}{tuple(scale.shape)} for rows of {dim}")


def _check_rope(
    cos: torch.Tensor, signed_sin: torch.Tensor, positions: torch.Tensor, tokens: int, dim: int
) -> int:
    """The rotated width of the rotary tables ``cos``/``signed_sin``, checked against heads of
    ``dim`` and ``positions`` (``[tokens]`` int64)."""
    rot = int(cos.shape[1])
    if rot > dim or rot % 2 or cos.shape != signed_sin.shape:
        raise ValueError(f"rotary tables {tuple(cos.shape)} for heads of {dim}")
    if positions.shape != (tokens,) or positions.dtype != torch.int64:
        raise ValueError(f"positions {positions.dtype}{tuple(positions.shape)}")
    return rot


def _rows(x: torch.Tensor) -> tuple[int, int, int, int]:
    """``x`` as (tokens, heads, dim, token stride): float32, heads packed, any token stride."""
    if x.dtype != torch.float32 or x.dim() not in (2, 3):
        raise ValueError(f"rows must be float32 [T, dim] or [T, heads, dim], got {x.dtype}")
    stride = x.stride()
    if x.dim() == 2:
        if stride[1] != 1:
            raise ValueError("rows must be contiguous in their last dimension")
        return x.shape[0], 1, x.shape[1], stride[0]
    if stride[2] != 1 or stride[1] != x.shape[2]:
        raise ValueError("heads must be packed: strides (any, dim, 1)")
    return x.shape[0], x.shape[1], x.shape[2], stride[0]


@functools.cache
def load_rownorm(isa: str | None = None) -> RowKernels | None:
    """The row kernels, built on first use; None (logged once) if they cannot be."""
    lib = load_library(SOURCE, "row kernels", "using torch", isa)
    return None if lib is None else RowKernels(lib)

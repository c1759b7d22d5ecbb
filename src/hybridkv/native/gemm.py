"""Skinny float32 GEMM (``gemm.c``): ``x [M, K] @ W[N, K]^T (+ bias)`` for the few rows of a
decode step, reading the weight once, in its own layout, on the step's thread pool.

``F.linear`` (MKL sgemm) repacks the whole weight on every call, which at a dozen rows costs
about three times the weight's memory traffic; MKL's packed sgemm needs a second copy of the
weight and runs on one thread. This kernel splits the weight's rows over the pool's threads
and streams each once. Every output is summed in one order (``gemm.c``), so the result does
not depend on the thread count nor on which other rows share the call.

``load_gemm()`` builds the C source like the other kernels (``hybridkv.native``) and returns
None where that is impossible or ``HYBRIDKV_NATIVE=0``; ``layers/linear.py`` then multiplies
with torch, which is also the kernel's test reference.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from hybridkv.native import load_library

SOURCE = Path(__file__).with_name("gemm.c")


def gemm_rows(x: torch.Tensor, k: int, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``x [..., k]`` as ``[M, k]`` rows with contiguous elements (copied if they are not), once
    ``bias`` is checked to be None or contiguous float32 ``[n]``."""
    if bias is not None and (
        bias.dtype != torch.float32 or not bias.is_contiguous() or bias.shape != (n,)
    ):
        raise ValueError(f"bias must be contiguous float32 [{n}], got {tuple(bias.shape)}")
    rows = x.reshape(-1, k) if x.dim() != 2 else x
    if rows.stride(-1) != 1 or (rows.shape[0] > 1 and rows.stride(0) < k):
        rows = rows.contiguous()
    return rows


class SkinnyGemm:
    """The C kernel with the checks that keep it inside its buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self._gemm = lib.hk_skinny_gemm
        self._gemm.argtypes = [ptr, i64, i64, ptr, i64, i64, ptr, ptr, ctypes.c_int]
        self._gemm.restype = None

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``F.linear(x, weight, bias)`` for float32 ``x`` ``[..., K]`` (rows with any stride,
        elements contiguous; else copied), ``weight`` ``[N, K]`` and ``bias`` ``[N]``
        (contiguous), on ``torch.get_num_threads()`` threads."""
        if x.dtype != torch.float32 or weight.dtype != torch.float32:
            raise ValueError(f"skinny GEMM is float32 only, got {x.dtype} x {weight.dtype}")
        if weight.dim() != 2 or not weight.is_contiguous() or x.shape[-1] != weight.shape[1]:
            raise ValueError(
                f"weight must be contiguous [N, K] for x [..., K]: {tuple(weight.shape)}, "
                f"x {tuple(x.shape)}"
            )
        n, k = weight.shape
        rows = gemm_rows(x, k, n, bias)
        out = torch.empty(*x.shape[:-1], n, dtype=torch.float32)
        self._gemm(
            rows.data_ptr(),
            rows.shape[0],
            rows.stride(0),
            weight.data_ptr(),
            n,
            k,
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            torch.get_num_threads(),
        )
        return out


@functools.cache
def load_gemm(isa: str | None = None) -> SkinnyGemm | None:
    """The skinny GEMM, built on first use; None (logged once) if it cannot be."""
    lib = load_library(SOURCE, "skinny GEMM", "using torch", isa)
    return None if lib is None else SkinnyGemm(lib)

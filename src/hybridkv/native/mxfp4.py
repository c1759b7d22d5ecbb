"""MXFP4 GEMM (``mxfp4.c``): ``x [M, K] @ W[N, K]^T (+ bias)`` with ``W`` kept in the OCP MX
FP4 layout of gpt-oss checkpoints and float32 activations.

The layout (as the checkpoint stores it, per expert): ``blocks`` uint8 ``[N, K / 32, 16]``, 32
e2m1 values a block, value ``2i`` in byte ``i``'s low nibble and ``2i + 1`` in its high one;
``scales`` uint8 ``[N, K / 32]``, e8m0 exponents: ``w = E2M1[code] * 2^(scale - 127)``. Every
such value is exact in float32 (scales up to ``MAX_SCALE``; above it a weight overflows, 255 is
e8m0's NaN), so the kernel's dequantized weights equal ``dequantize_reference``'s bit for bit.

``mxfp4_linear`` runs up to ``MXFP4_MAX_ROWS`` rows on the kernel (the weight read once, in
its own layout); more rows (prefill) dequantize the weight to float32 once and call
``F.linear``. ``load_mxfp4()`` builds the C source like the other kernels (``hybridkv.native``:
one build per ISA variant) and returns None where that is impossible or ``HYBRIDKV_NATIVE=0``;
``dequantize_reference`` (torch) is then the fallback, and always the tests' reference.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from hybridkv.native import load_library
from hybridkv.native.gemm import gemm_rows

SOURCE = Path(__file__).with_name("mxfp4.c")
BLOCK_VALUES = 32
BLOCK_BYTES = 16
MAX_SCALE = 252  # 6 * 2^(252 - 127) < float32's max < 6 * 2^(253 - 127)
MXFP4_MAX_ROWS = 16  # more rows: dequantized once, then F.linear
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def check_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    """``(N, K)`` of contiguous uint8 ``blocks [N, K/32, 16]`` and ``scales [N, K/32]``; else
    ValueError. (Scale values are checked once, at load: ``check_scales``.)"""
    for name, t, dim in (("blocks", blocks, 3), ("scales", scales, 2)):
        if t.dtype != torch.uint8 or t.dim() != dim or not t.is_contiguous():
            raise ValueError(f"MXFP4 {name} must be contiguous uint8 of {dim} dims")
    if blocks.shape[2] != BLOCK_BYTES or blocks.shape[:2] != scales.shape:
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}"
        )
    return int(blocks.shape[0]), int(blocks.shape[1]) * BLOCK_VALUES


def check_scales(scales: torch.Tensor) -> None:
    """ValueError if any e8m0 scale is NaN (255) or large enough to overflow a weight."""
    if scales.numel() and int(scales.max()) > MAX_SCALE:
        raise ValueError(f"MXFP4 scale {int(scales.max())} > {MAX_SCALE} (NaN or overflow)")


def dequantize_reference(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 ``[..., K]`` of ``blocks [..., K/32, 16]`` and ``scales [..., K/32]`` (torch)."""
    lut = torch.tensor(E2M1, dtype=torch.float32)
    codes = torch.stack((blocks & 15, blocks >> 4), dim=-1).long()  # [..., G, 16, 2]
    values = lut[codes].flatten(-2)  # [..., G, 32]
    exponents = scales.to(torch.int32)[..., None] - 127
    return torch.ldexp(values, exponents).flatten(-2)  # exact: a power of two times e2m1


class Mxfp4Gemm:
    """The C kernels with the checks that keep them inside their buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self._gemm = lib.hk_mxfp4_gemm
        self._gemm.argtypes = [ptr, i64, i64, ptr, ptr, i64, i64, ptr, ptr, ctypes.c_int]
        self._gemm.restype = ctypes.c_int
        self._dequantize = lib.hk_mxfp4_dequantize
        self._dequantize.argtypes = [ptr, ptr, i64, i64, ptr, ctypes.c_int]
        self._dequantize.restype = None

    def linear(
        self,
        x: torch.Tensor,
        blocks: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``F.linear(x, W, bias)`` for float32 ``x`` ``[..., K]``, ``W`` in MXFP4 (``blocks``,
        ``scales``) and float32 ``bias`` ``[N]``, on ``torch.get_num_threads()`` threads."""
        n, k = check_mxfp4(blocks, scales)
        if x.dtype != torch.float32 or x.shape[-1] != k:
            raise ValueError(f"MXFP4 GEMM takes float32 [..., {k}], got {x.dtype} {x.shape}")
        rows = gemm_rows(x, k, n, bias)
        out = torch.empty(*x.shape[:-1], n, dtype=torch.float32)
        if rows.shape[0] == 0 or n == 0:
            return out
        status = self._gemm(
            rows.data_ptr(),
            rows.shape[0],
            rows.stride(0),
            blocks.data_ptr(),
            scales.data_ptr(),
            n,
            k,
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            torch.get_num_threads(),
        )
        if status != 0:
            raise MemoryError("MXFP4 GEMM: no memory for its dequantized panels")
        return out

    def dequantize(self, blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """float32 ``[N, K]``: the values the GEMM multiplies, bit for bit."""
        n, k = check_mxfp4(blocks, scales)
        out = torch.empty(n, k, dtype=torch.float32)
        if n:
            threads = torch.get_num_threads()
            self._dequantize(blocks.data_ptr(), scales.data_ptr(), n, k, out.data_ptr(), threads)
        return out


@functools.cache
def load_mxfp4(isa: str | None = None) -> Mxfp4Gemm | None:
    """The MXFP4 GEMM, built on first use; None (logged once) if it cannot be."""
    lib = load_library(SOURCE, "MXFP4 GEMM", "dequantizing with torch", isa)
    return None if lib is None else Mxfp4Gemm(lib)


def mxfp4_linear(
    x: torch.Tensor, blocks: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear(x, W, bias)`` in float32 for ``W`` in MXFP4: the kernel for decode-sized
    ``x``, a float32 copy of ``W`` made for the call otherwise (or without the kernel)."""
    x = x.float()
    kernel = load_mxfp4()
    if kernel is not None and x.numel() <= MXFP4_MAX_ROWS * x.shape[-1]:
        return kernel.linear(x, blocks, scales, bias)
    if kernel is not None:
        weight = kernel.dequantize(blocks, scales)  # [N, K]
    else:
        check_mxfp4(blocks, scales)
        weight = dequantize_reference(blocks, scales)
    return F.linear(x, weight, bias)

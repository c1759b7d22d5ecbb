"""Block-quantized GEMM (``quant.c``): ``x [M, K] @ W[N, K]^T (+ bias)`` with ``W`` kept in a
GGUF block format (``quant_blocks.QuantFormat``: Q8_0, Q4_K, Q6_K) and float32 activations,
for the few rows of a decode step; and the weight dequantized to float32 (``dequantize``), for
steps with many rows, which multiply panels of it with ``F.linear``.

Each thread dequantizes panels of 4 weight rows into an L2-resident float32 scratch and
multiplies every x row against them; every output is summed in one order, so results do not
depend on the thread count nor on which other rows share the call (``quant.c``).

``load_quant()`` builds the C source like the other kernels (``hybridkv.native``) and returns
None where that is impossible or ``HYBRIDKV_NATIVE=0``; ``quant_blocks.dequantize`` (numpy) is
then the fallback, and always the tests' reference.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from hybridkv.native import load_library
from hybridkv.native.gemm import gemm_rows
from hybridkv.native.quant_blocks import QuantFormat

SOURCE = Path(__file__).with_name("quant.c")


def check_packed(data: torch.Tensor, fmt: QuantFormat, k: int) -> int:
    """The row count of ``data``, a contiguous uint8 ``[N, row_bytes(k)]``; else ValueError."""
    if data.dtype != torch.uint8 or data.dim() != 2 or not data.is_contiguous():
        raise ValueError(f"{fmt.name} weight must be contiguous uint8 [N, row bytes]")
    if data.shape[1] != fmt.row_bytes(k):
        raise ValueError(
            f"{fmt.name} weight of {k} columns has {fmt.row_bytes(k)} bytes a row, "
            f"got {data.shape[1]}"
        )
    return int(data.shape[0])


class QuantGemm:
    """The C kernels with the checks that keep them inside their buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        self._gemm = lib.hk_quant_gemm
        self._gemm.argtypes = [c_int, ptr, i64, i64, ptr, i64, i64, ptr, ptr, c_int]
        self._gemm.restype = c_int
        self._gemm_i8 = lib.hk_quant_gemm_i8
        self._gemm_i8.argtypes = self._gemm.argtypes
        self._gemm_i8.restype = c_int
        tile_rows = lib.hk_quant_i8_tile_rows
        tile_rows.restype = c_int
        # x rows from which the int8 path of Q4_K / Q6_K runs tiled (quant_tiled.h); 0: never
        self.tile_rows = int(tile_rows())
        self._dequantize = lib.hk_quant_dequantize
        self._dequantize.argtypes = [c_int, ptr, i64, i64, ptr, c_int]
        self._dequantize.restype = None

    def linear(
        self,
        x: torch.Tensor,
        data: torch.Tensor,
        fmt: QuantFormat,
        bias: torch.Tensor | None = None,
        int8_activations: bool = False,
    ) -> torch.Tensor:
        """``F.linear(x, W, bias)`` for float32 ``x`` ``[..., K]`` (rows with any stride,
        elements contiguous; else copied), ``W`` = ``data`` (``[N, row_bytes(K)]`` in ``fmt``)
        and float32 ``bias`` ``[N]``, on ``torch.get_num_threads()`` threads.
        ``int8_activations``: each x row quantized to int8 per block of 32 (Q8_0) or 256
        (Q4_K, Q6_K) values and multiplied in integers (``quant_int8.h``; numerics as
        ``quantize_activations``)."""
        if x.dtype != torch.float32:
            raise ValueError(f"quantized GEMM takes float32 activations, got {x.dtype}")
        k = x.shape[-1]
        n = check_packed(data, fmt, k)
        rows = gemm_rows(x, k, n, bias)
        m = rows.shape[0]
        out = torch.empty((m, n) if x.dim() == 2 else (*x.shape[:-1], n), dtype=torch.float32)
        if m == 0 or n == 0:
            return out
        gemm = self._gemm_i8 if int8_activations else self._gemm
        b = None if bias is None else bias.data_ptr()
        threads = torch.get_num_threads()
        args = (rows.data_ptr(), m, rows.stride(0), data.data_ptr(), n, k, b, out.data_ptr())
        status = gemm(fmt.layout.ggml_type, *args, threads)
        if status != 0:
            raise MemoryError("quantized GEMM: no memory for its scratch")
        return out

    def dequantize(self, data: torch.Tensor, fmt: QuantFormat, k: int) -> torch.Tensor:
        """float32 ``[N, k]`` of ``data`` (``[N, row_bytes(k)]`` in ``fmt``): the values the
        GEMM multiplies, bit for bit."""
        n = check_packed(data, fmt, k)
        out = torch.empty(n, k, dtype=torch.float32)
        if n:
            threads = torch.get_num_threads()
            self._dequantize(fmt.layout.ggml_type, data.data_ptr(), n, k, out.data_ptr(), threads)
        return out


@functools.cache
def load_quant(isa: str | None = None) -> QuantGemm | None:
    """The quantized GEMM, built on first use; None (logged once) if it cannot be."""
    lib = load_library(SOURCE, "quantized GEMM", "dequantizing with numpy", isa)
    return None if lib is None else QuantGemm(lib)

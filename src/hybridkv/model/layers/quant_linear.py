"""Projections whose weight stays block-quantized (GGUF Q8_0, Q4_K, Q6_K): ``quant_linear``.

A quantized ``Linear`` (``layers/linear.py``) holds its weight as the file has it: a uint8
``[N, row_bytes]`` parameter (``native/quant_blocks.py`` has the layouts) and its format in
``Linear.quant``; nothing is dequantized to float32 in memory for good. Products are float32:

- up to ``QUANT_MAX_ROWS`` rows (decode steps): the native kernel (``native/quant.c``); for
  the formats in ``INT8_FORMATS`` up to ``int8_max_rows`` rows (the K-quants: ``INT8_MAX_ROWS``),
  with each x row quantized to int8 per block and integer dot products
  (``native/quant_int8.h``, Q8_0's ``native/quant_q8_0.h``; K-quants from 16 rows, on AVX2
  builds, the tiled kernel ``native/quant_tiled.h``, bitwise the same), else with float32
  activations (weights dequantized in registers or L2 panels);
- more rows (prefill, mixed steps): ``PANEL_ROWS`` weight rows at a time dequantized to a
  float32 scratch (by the kernel's own code, so the same values) and multiplied by
  ``F.linear``: each weight is read once per call and the scratch stays small;
- without the native library (no compiler, ``HYBRIDKV_NATIVE=0``): the same panels, dequantized
  by numpy (``quant_blocks.dequantize``, the kernels' reference).

``choose_path`` is the one place that picks among them (the compiled decode program asks it
too, at planning).
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.native.quant import QuantGemm, load_quant
from hybridkv.native.quant_blocks import QuantFormat, dequantize

# rows up to which the kernel beats dequantized panels + F.linear (one thread, CPU time, four
# Granite-small layers' projections: 32 rows 29 vs 38 ms, 48 rows 39 vs 39, 64 rows 54 vs 54,
# 128 rows 108 vs 81 ms)
QUANT_MAX_ROWS = 48
# weight rows per dequantized panel (8 MB of float32 at K = 2048): F.linear (MKL) packs x
# again for every panel, so fewer, larger panels win: 1024 against 256 rows, Q8_0 / Q4_K,
# Granite-small projections, one thread, CPU time, AVX2 EPYC (loaded): 1.06x at 64 rows,
# 1.09x at 512, 1.06-1.25x at 2048; the whole weight at once: 0.84-1.12x
PANEL_ROWS = 1024
# steps of up to int8_max_rows(fmt) rows of these formats take int8 activations (llama.cpp's
# Q8_K for the K-quants, Q8_0 for Q8_0): decode 1.35-2.2x (Q4_K) and 1.7x (Q6_K) faster than
# float32 activations (docs/benchmarks.md), within the quality gate (docs/quantization.md).
# Prefill-sized steps, measured per format and per kernel build (one thread, CPU time, Granite-
# small projections, AMD EPYC Zen 3 AVX2, benchmarks/quant_prefill.py; docs/benchmarks.md):
# - tiled builds (AVX2, QuantGemm.tile_rows > 0): since the 2 x 4 register tile (branch
#   int8pf) both K-quants' tiles beat the panels at every row count measured (Q4_K 1.3-1.9x,
#   Q6_K 1.3-2.0x from 256 to 2,048 rows; loaded machine), so no cap;
# - per-row builds (scalar, AVX-512): INT8_MAX_ROWS for both K-quants (measured on the Xeon);
# - Q8_0 has no tiled kernel: int8 up to QUANT_MAX_ROWS rows (its per-row kernel,
#   native/quant_q8_0.h, is as fast as the float32 one or faster from 1 to 48 rows), then panels
INT8_FORMATS = frozenset({QuantFormat.Q4_K, QuantFormat.Q6_K, QuantFormat.Q8_0})
INT8_MAX_ROWS = 256
UNCAPPED = 1 << 62
# (format, tiled build) -> the rows up to which int8 activations win
INT8_ROWS_TABLE: dict[tuple[QuantFormat, bool], int] = {
    (QuantFormat.Q4_K, True): UNCAPPED,
    (QuantFormat.Q6_K, True): UNCAPPED,
    (QuantFormat.Q4_K, False): INT8_MAX_ROWS,
    (QuantFormat.Q6_K, False): INT8_MAX_ROWS,
    (QuantFormat.Q8_0, True): QUANT_MAX_ROWS,
    (QuantFormat.Q8_0, False): QUANT_MAX_ROWS,
}


def int8_max_rows(fmt: QuantFormat, tiled: bool | None = None) -> int:
    """The rows up to which ``fmt`` (one of ``INT8_FORMATS``) takes int8 activations;
    ``tiled``: whether the kernel build has the tiled int8 GEMM (None: this process's)."""
    if tiled is None:
        kernel = load_quant()
        tiled = kernel is not None and kernel.tile_rows > 0
    return INT8_ROWS_TABLE[fmt, tiled]


class QuantPath(Enum):
    """How a product with a block-quantized weight is computed."""

    FLOAT_KERNEL = "float32 activations, native kernel"
    INT8_KERNEL = "int8 activations, native kernel (per-row or tiled)"
    PANELS = "dequantized panels + F.linear"


def choose_path(
    fmt: QuantFormat, rows: int, native: bool = True, tiled: bool | None = None
) -> QuantPath:
    """The path for ``rows`` activation rows against a ``fmt`` weight (``native``: whether the
    native library is there; ``tiled``: whether it has the tiled int8 GEMM, None: this
    process's library)."""
    if not native:
        return QuantPath.PANELS
    if fmt in INT8_FORMATS and rows <= int8_max_rows(fmt, tiled):
        return QuantPath.INT8_KERNEL
    return QuantPath.FLOAT_KERNEL if rows <= QUANT_MAX_ROWS else QuantPath.PANELS


def quant_linear(
    x: torch.Tensor,
    data: torch.Tensor,
    fmt: QuantFormat,
    bias: torch.Tensor | None = None,
    kernel: QuantGemm | None = None,
) -> torch.Tensor:
    """``x [..., K] @ W^T (+ bias)`` for ``W`` = ``data`` (``[N, row_bytes(K)]`` uint8 in
    ``fmt``), computed in float32 and returned in ``x.dtype``; ``kernel`` None: the process's
    native library (if it could be built)."""
    kernel = kernel if kernel is not None else load_quant()
    xf = x if x.dtype == torch.float32 else x.to(torch.float32)
    bias = None if bias is None else bias.to(torch.float32)
    rows = xf.numel() // max(xf.shape[-1], 1)
    tiled = kernel is not None and kernel.tile_rows > 0
    path = choose_path(fmt, rows, kernel is not None, tiled)
    if kernel is not None and path is not QuantPath.PANELS:
        int8 = path is QuantPath.INT8_KERNEL
        out = kernel.linear(xf, data, fmt, bias, int8_activations=int8)
    else:
        out = linear_by_panels(xf, data, fmt, bias, kernel)
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def dequantize_weight(
    data: torch.Tensor, fmt: QuantFormat, k: int, kernel: QuantGemm | None = None
) -> torch.Tensor:
    """float32 ``[N, k]`` of ``data`` (the native dequantizer, else numpy's)."""
    if kernel is not None:
        return kernel.dequantize(data, fmt, k)
    return torch.from_numpy(dequantize(data.contiguous().numpy(), fmt, k))


def linear_by_panels(
    x: torch.Tensor,
    data: torch.Tensor,
    fmt: QuantFormat,
    bias: torch.Tensor | None,
    kernel: QuantGemm | None,
) -> torch.Tensor:
    """float32 ``x @ W^T (+ bias)``, ``PANEL_ROWS`` weight rows at a time dequantized (by
    ``kernel``, else numpy) and multiplied by ``F.linear``: the prefill path."""
    n, k = data.shape[0], x.shape[-1]
    fmt.row_bytes(k)  # checks K before any slicing
    if n <= PANEL_ROWS:  # one panel: F.linear's result is the output (no copy into one)
        return F.linear(x, dequantize_weight(data, fmt, k, kernel), bias)
    out = torch.empty(*x.shape[:-1], n, dtype=torch.float32)  # [..., N]
    for start in range(0, n, PANEL_ROWS):
        stop = min(start + PANEL_ROWS, n)
        w = dequantize_weight(data[start:stop], fmt, k, kernel)  # [stop - start, K]
        part_bias = None if bias is None else bias[start:stop]
        out[..., start:stop] = F.linear(x, w, part_bias)
    return out


class QuantizableLinear(Protocol):
    """What ``set_quantized_weight`` needs of ``layers/linear.py``'s ``Linear``."""

    in_features: int
    out_features: int
    quant: QuantFormat | None
    _parameters: dict[str, nn.Parameter | None]


def set_quantized_weight(linear: QuantizableLinear, data: torch.Tensor, fmt: QuantFormat) -> None:
    """Make ``linear`` (a ``layers/linear.py`` ``Linear``) multiply by ``data``: its weight
    as uint8 ``[out_features, row_bytes(in_features)]`` blocks of ``fmt``."""
    expected = (linear.out_features, fmt.row_bytes(linear.in_features))
    if data.dtype != torch.uint8 or tuple(data.shape) != expected:
        raise ValueError(
            f"{fmt.name} weight must be uint8 {expected}, got {data.dtype} {tuple(data.shape)}"
        )
    linear._parameters["weight"] = nn.Parameter(data.contiguous(), requires_grad=False)
    linear.quant = fmt


def dequantize_linear_(linear: QuantizableLinear) -> None:
    """Give a quantized ``linear`` its float32 weight (the quality gate's reference: the same
    values through the float32 path); a float one is left as it is."""
    fmt, weight = linear.quant, linear._parameters["weight"]
    if fmt is None or weight is None:
        return
    values = dequantize_weight(weight.detach(), fmt, linear.in_features, load_quant())
    linear._parameters["weight"] = nn.Parameter(values, requires_grad=False)
    linear.quant = None


def set_quantized_experts(
    module: nn.Module, attr: str, data: torch.Tensor, fmt: QuantFormat, in_dim: int
) -> None:
    """Make ``module``'s expert stack ``attr`` (``[E, out, in]``) the blocks ``data``: uint8
    ``[E, out, row_bytes(in)]`` of ``fmt``, which the parameter carries as ``quant`` (what
    ``moe.expert_linear`` multiplies by, one expert's rows at a time)."""
    if data.dtype != torch.uint8 or data.dim() != 3 or data.shape[-1] != fmt.row_bytes(in_dim):
        raise ValueError(f"{fmt.name} experts must be uint8 [E, out, {fmt.row_bytes(in_dim)}]")
    param = nn.Parameter(data.contiguous(), requires_grad=False)
    setattr(param, "quant", fmt)  # noqa: B010 (a Parameter has no declared slot for it)
    setattr(param, "in_features", in_dim)  # noqa: B010
    module._parameters[attr] = param


def dequantize_experts_(module: nn.Module) -> None:
    """Give ``module``'s quantized expert stacks their float32 values (the quality gate's
    reference)."""
    for attr, param in list(module._parameters.items()):
        fmt = getattr(param, "quant", None)
        if param is None or fmt is None or param.dim() != 3:
            continue
        k = int(getattr(param, "in_features"))  # noqa: B009
        rows = dequantize_weight(param.detach().reshape(-1, param.shape[-1]), fmt, k, load_quant())
        values = rows.reshape(param.shape[0], param.shape[1], k)  # [E, out, in]
        module._parameters[attr] = nn.Parameter(values, requires_grad=False)


class QuantEmbedding(nn.Embedding):
    """An embedding whose table stays block-quantized (a GGUF ``token_embd`` in Q8_0 / Q4_K /
    Q6_K): a lookup gathers the ids' rows of blocks and dequantizes only those. ``quant`` and
    the uint8 ``weight`` are what a tied ``lm_head`` (a ``Linear``) shares."""

    def __init__(self, data: torch.Tensor, fmt: QuantFormat, dim: int, dtype: torch.dtype) -> None:
        rows = data.shape[0]  # a meta _weight: nn.Embedding then draws no random table
        super().__init__(rows, dim, _weight=torch.empty(rows, dim, device="meta"))
        self.quant: QuantFormat | None = fmt
        self.out_dtype = dtype
        if data.dtype != torch.uint8 or tuple(data.shape) != (data.shape[0], fmt.row_bytes(dim)):
            raise ValueError(f"{fmt.name} embedding must be uint8 [V, {fmt.row_bytes(dim)}]")
        self.weight = nn.Parameter(data, requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        assert self.quant is not None
        rows = self.weight.index_select(0, ids.reshape(-1))  # [T, row_bytes]
        values = dequantize_weight(rows, self.quant, self.embedding_dim, load_quant())  # [T, dim]
        return values.to(self.out_dtype).reshape(*ids.shape, self.embedding_dim)

"""Linear layers that multiply in their weight's dtype and answer in the input's dtype.

Normally weight and input share a dtype and both casts are no-ops. They differ when a bfloat16
model keeps float32 matmul weights on a CPU without native bfloat16 arithmetic
(``hybridkv.model.loading.matmul``): activations stay bfloat16 between layers, each product is
taken in float32 and rounded back to bfloat16, as a native bfloat16 kernel would round its
float32 accumulator.

float32 weights of ``Linear`` / ``FusedLinear`` (projections and the lm_head) are multiplied at
up to ``SKINNY_MAX_ROWS`` rows (decode steps) by the native skinny GEMM
(``hybridkv.native.gemm``): the weight read once in its own layout, split over the step's
threads. ``F.linear`` (MKL sgemm) repacks the whole weight at every call, about three times the
traffic at a dozen rows. Measured (docs/benchmarks.md, "skinny GEMM"): on one thread
(qwen3_full-small's step of weights, CPU time) 12 rows 37 ms vs F.linear's 65 ms, level with
MKL's packed sgemm, which needed a second copy of every weight and ran on one thread only (it
was dropped). More rows (prefill, mixed steps) and other dtypes take ``F.linear``, as does
everything when the kernel cannot be built or ``HYBRIDKV_NATIVE=0``. Prepacked weights for
those rows (MKL's ``_mkl_linear``, oneDNN's ``_linear_pointwise``; a second copy of each weight)
were measured on B1's mixed-step rows (``benchmarks/prefill_gemm.py``): 1.11x on one thread
(MKL), no clear gain on two, so they are not used.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.layers.quant_linear import quant_linear
from hybridkv.native.gemm import SkinnyGemm, load_gemm
from hybridkv.native.quant_blocks import QuantFormat

# rows up to which the skinny kernel clearly beats F.linear (one thread, CPU time, a step of
# qwen3_full-small's weights, load 9: 48 rows 74 vs 105 ms; at 64 rows the two runs disagreed,
# 92 vs 97 and 124 vs 104 ms; 96 rows level). B1's decode steps have at most 16.
SKINNY_MAX_ROWS = 48
# below this many weight elements F.linear is level (one thread, 12 rows, warm: 256x256 22 us
# either way) and its call costs less (16x64: 2.5 vs 8 us)
SKINNY_MIN_ELEMENTS = 65536


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` computed in ``weight.dtype``, returned in ``x.dtype``; through the skinny
    kernel where ``ProjectionGemm`` takes it (e.g. MoE experts' few rows)."""
    return _shared_gemm()(x, weight, bias)


def torch_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` computed in ``weight.dtype``, returned in ``x.dtype``."""
    if x.dtype == weight.dtype:  # NOTE: a no-op ``.to`` still costs a dispatch (~2 us)
        return F.linear(x, weight, bias)
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)


class ProjectionGemm:
    """``linear`` for a projection: few rows of a float32 weight through the skinny kernel,
    anything else through ``F.linear``. ``kernel`` None: always ``F.linear``.

    NOTE: a plain object, not a module: it holds no tensor.
    """

    def __init__(
        self,
        kernel: SkinnyGemm | None = None,
        max_rows: int = SKINNY_MAX_ROWS,
        min_elements: int = SKINNY_MIN_ELEMENTS,
    ) -> None:
        self.kernel = load_gemm() if kernel is None else kernel
        self.max_rows, self.min_elements = max_rows, min_elements

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        quant: QuantFormat | None = None,
    ) -> torch.Tensor:
        if quant is not None:  # weight: uint8 blocks (``layers/quant_linear.py``)
            return quant_linear(x, weight, quant, bias)
        if not self.takes(x, weight, bias):
            return torch_linear(x, weight, bias)
        assert self.kernel is not None
        if x.dtype == torch.float32:
            return self.kernel.linear(x, weight, bias)
        return self.kernel.linear(x.to(torch.float32), weight, bias).to(x.dtype)

    def takes(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """Whether ``x`` by ``weight`` runs on the skinny kernel."""
        return (
            self.kernel is not None
            and weight.dtype == torch.float32
            and x.numel() <= self.max_rows * weight.shape[-1]
            and weight.numel() >= self.min_elements
            and x.is_cpu
            and weight.dim() == 2
            and weight.is_contiguous()
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
            and not (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
        )


@functools.cache
def _shared_gemm() -> ProjectionGemm:
    """The ``ProjectionGemm`` of ``linear`` (made on first use: it builds the kernel)."""
    return ProjectionGemm()


def tensor_version(t: torch.Tensor) -> int:
    try:
        return int(t._version)
    except RuntimeError:  # an inference tensor: it has no version counter
        return -1


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and checkpoint names) through ``ProjectionGemm``.

    ``quant`` None: ``weight`` is ``[out, in]`` floats. Else a GGUF block format, and
    ``weight`` is its uint8 ``[out, row_bytes(in)]`` blocks (set by the GGUF loader)."""

    quant: QuantFormat | None = None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self.gemm = ProjectionGemm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x, self.weight, self.bias, self.quant)

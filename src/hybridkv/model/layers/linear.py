"""Linear layers that multiply in their weight's dtype and answer in the input's dtype.

Normally weight and input share a dtype and both casts are no-ops. They differ when a bfloat16
model keeps float32 matmul weights on a CPU without native bfloat16 arithmetic
(``hybridkv.model.matmul``): activations stay bfloat16 between layers, each product is taken in
float32 and rounded back to bfloat16, as a native bfloat16 kernel would round its float32
accumulator.

float32 weights of ``Linear`` / ``FusedLinear`` are multiplied through MKL's packed sgemm
(``PackedWeight``): the weight is reordered into MKL's panel layout once, instead of at every
call as ``F.linear`` does. Measured on one thread (docs/benchmarks.md, issue 17): 1.7-1.9x less
time at decode shapes (16 rows), level or slightly faster at prefill shapes (2,048 rows), the
same values up to summation order (bitwise equal for K = 768 here, ~2e-6 apart for K = 2048).
It costs a second copy of those weights; ``HYBRIDKV_PACKED_GEMM=0`` turns it off.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

# MKL's packed format of B does not depend on M (the size asked for equals for every M and
# the products are correct for any M, tests/model/test_packed_linear.py); this is only the hint.
PACK_ROWS_HINT = 2048
# below this many weight elements packing gains nothing (one thread, 16 rows: 64x128 5.0 vs
# 5.6 us, 128x128 7.7 vs 7.0, 256x256 23 vs 16 us for F.linear vs packed)
PACK_MIN_ELEMENTS = 32768


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` computed in ``weight.dtype``, returned in ``x.dtype``."""
    if x.dtype == weight.dtype:  # NOTE: a no-op ``.to`` still costs a dispatch (~2 us)
        return F.linear(x, weight, bias)
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)


def packing_enabled() -> bool:
    """Whether float32 projections use MKL's packed sgemm (MKL present, not switched off)."""
    return bool(torch._C.has_mkl) and os.environ.get("HYBRIDKV_PACKED_GEMM", "1") != "0"


class PackedWeight:
    """A float32 weight ``[out, in]`` in MKL's packed layout, rebuilt when the weight tensor is
    replaced or changed in place; ``__call__`` is ``linear`` through it. Weights under
    ``PACK_MIN_ELEMENTS`` stay unpacked (no gain measured there).

    NOTE: a plain object, not a module: the packed copy is no parameter and no buffer.
    """

    def __init__(self) -> None:
        self.enabled = packing_enabled()
        self._key: tuple[object, ...] = ()
        self._packed: torch.Tensor | None = None

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        if weight.requires_grad and torch.is_grad_enabled():  # no autograd formula
            return linear(x, weight, bias)
        if torch.get_num_threads() > 1:
            # MKL's packed sgemm runs on one thread through torch: on a pool of 2, packed
            # qwen3_full-small prefill took 2.27 s, plain F.linear 1.35 s (thread_phases.py)
            return linear(x, weight, bias)
        packed = self._packed_for(weight)
        if packed is None:
            return linear(x, weight, bias)
        x32 = x if x.dtype == torch.float32 else x.to(torch.float32)
        if not x32.is_contiguous():
            x32 = x32.contiguous()
        rows = x32.numel() // weight.shape[1]
        out: torch.Tensor = torch.ops.mkl._mkl_linear(x32, packed, weight, bias, rows)
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def _packed_for(self, weight: torch.Tensor) -> torch.Tensor | None:
        key = (weight.data_ptr(), tensor_version(weight), weight.shape, weight.dtype)
        if key != self._key:
            self._packed = self._pack(weight)
            self._key = key
        return self._packed

    def _pack(self, weight: torch.Tensor) -> torch.Tensor | None:
        if (
            not self.enabled
            or weight.dtype != torch.float32
            or not weight.is_cpu
            or weight.dim() != 2
            or weight.numel() < PACK_MIN_ELEMENTS
        ):
            return None
        with torch.no_grad():
            packed: torch.Tensor = torch.ops.mkl._mkl_reorder_linear_weight(
                weight.contiguous(), PACK_ROWS_HINT
            )
        return packed


def tensor_version(t: torch.Tensor) -> int:
    try:
        return int(t._version)
    except RuntimeError:  # an inference tensor: it has no version counter
        return -1


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and checkpoint names) through ``linear``; float32 weights
    through a packed copy (``PackedWeight``)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self.packed = PackedWeight()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.packed(x, self.weight, self.bias)

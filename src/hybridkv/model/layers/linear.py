"""Linear layers that multiply in their weight's dtype and answer in the input's dtype.

Normally weight and input share a dtype and both casts are no-ops. They differ when a bfloat16
model keeps float32 matmul weights on a CPU without native bfloat16 arithmetic
(``hybridkv.model.matmul``): activations stay bfloat16 between layers, each product is taken in
float32 and rounded back to bfloat16, as a native bfloat16 kernel would round its float32
accumulator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` computed in ``weight.dtype``, returned in ``x.dtype``."""
    if x.dtype == weight.dtype:  # NOTE: a no-op ``.to`` still costs a dispatch (~2 us)
        return F.linear(x, weight, bias)
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and checkpoint names) through ``linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

"""RMS norms: plain (``w * x``), Gemma's offset form (``(1 + w) * x``) and Mamba's gated one."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Normalise in float32, cast back, then scale (Llama/Qwen/Granite order of casts)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class OffsetRMSNorm(nn.Module):
    """Gemma: scale by ``1 + w`` in float32, then cast back (weights are stored around 0)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """Mamba2 output norm: ``x * silu(gate)``, then RMS-normalised per group of channels."""

    def __init__(self, dim: int, num_groups: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.num_groups = num_groups
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float() * F.silu(gate.float())
        grouped = x32.view(*x32.shape[:-1], self.num_groups, -1)  # [..., groups, dim / groups]
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        out: torch.Tensor = self.weight * grouped.flatten(-2).to(x.dtype)
        return out

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
        if x.dtype == self.weight.dtype == torch.float32:  # no casts: one call, same bits
            return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)
        normed = F.rms_norm(x.float(), x.shape[-1:], eps=self.eps)  # float32
        return self.apply_scale(normed, self.weight, x.dtype)

    def scale(self) -> torch.Tensor:
        """What ``apply_scale`` multiplies by, ``[dim]``."""
        return self.weight

    @staticmethod
    def apply_scale(normed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return scale * normed.to(dtype)


class OffsetRMSNorm(nn.Module):
    """Gemma: scale by ``1 + w`` in float32, then cast back (weights are stored around 0)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), x.shape[-1:], eps=self.eps)  # float32
        return self.apply_scale(normed, self.scale(), x.dtype)

    def scale(self) -> torch.Tensor:
        return 1.0 + self.weight.float()

    @staticmethod
    def apply_scale(normed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (normed * scale).to(dtype)


class GatedRMSNorm(nn.Module):
    """Mamba2 output norm: ``x * silu(gate)``, then RMS-normalised per group of channels;
    with ``norm_before_gate`` (Falcon-H1) normalised and scaled first, then gated."""

    def __init__(
        self, dim: int, num_groups: int, eps: float, norm_before_gate: bool = False
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.num_groups = num_groups
        self.eps = eps
        self.norm_before_gate = norm_before_gate

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        if not self.norm_before_gate:
            x32 = x32 * F.silu(gate.float())
        grouped = x32.view(*x32.shape[:-1], self.num_groups, -1)  # [..., groups, dim / groups]
        grouped = F.rms_norm(grouped, grouped.shape[-1:], eps=self.eps)
        if self.norm_before_gate:
            gated = self.weight.float() * grouped.flatten(-2) * F.silu(gate.float())
            return gated.to(x.dtype)
        out: torch.Tensor = self.weight * grouped.flatten(-2).to(x.dtype)
        return out

"""RMS norms: plain (``w * x``), Gemma's offset form (``(1 + w) * x``) and Mamba's gated one.

float32 activations go through the native row kernel (``hybridkv.native.rownorm``) when it is
built and autograd is off: one call instead of torch's ~6 ops; ``add_norm`` also folds the
residual add in. The torch code below is the fallback and the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.layers.linear import tensor_version
from hybridkv.native.rownorm import RowKernels, load_rownorm
from hybridkv.native.ssm_prefill import load_ssm_prefill


def row_kernels(x: torch.Tensor) -> RowKernels | None:
    """The native row kernels for float32 ``x`` with autograd off, else None (torch path)."""
    if x.dtype != torch.float32 or torch.is_grad_enabled():
        return None
    return load_rownorm()


class RMSNorm(nn.Module):
    """Normalise in float32, cast back, then scale (Llama/Qwen/Granite order of casts)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype == torch.float32:  # no casts: one call, same bits
            kernels = row_kernels(x)
            if kernels is not None:
                return kernels.rms_norm(x, self.weight, self.eps)
            return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)
        normed = F.rms_norm(x.float(), x.shape[-1:], eps=self.eps)  # float32
        return self.apply_scale(normed, self.weight, x.dtype)

    def add_norm(
        self, x: torch.Tensor, residual: torch.Tensor, x_scale: float = 1.0
    ) -> torch.Tensor:
        """``residual += x`` (in place), then the norm of the sum; ``x_scale`` != 1: ``x`` (the
        caller's own scratch) is first multiplied by it in place, ``x.mul_(x_scale)``."""
        kernels = row_kernels(x) if self.weight.dtype == torch.float32 else None
        if (
            kernels is not None
            and residual.dtype == torch.float32
            and residual.is_contiguous()
            and (x_scale == 1.0 or x.is_contiguous())
        ):
            return kernels.rms_norm(x, self.weight, self.eps, residual=residual, x_scale=x_scale)
        return self.forward(residual.add_(x if x_scale == 1.0 else x.mul_(x_scale)))

    def norm_(self, x: torch.Tensor) -> torch.Tensor:
        """The norm of contiguous ``x`` written over ``x`` (a fresh tensor nobody else reads)."""
        kernels = row_kernels(x) if self.weight.dtype == torch.float32 else None
        if kernels is not None and x.is_contiguous():
            return kernels.rms_norm(x, self.weight, self.eps, out=x)
        return self.forward(x)

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
        self._scale_key: tuple[int, ...] = ()
        self._scale = torch.empty(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = row_kernels(x)
        if kernels is not None:
            return kernels.rms_norm(x, self._cached_scale(), self.eps)
        normed = F.rms_norm(x.float(), x.shape[-1:], eps=self.eps)  # float32
        return self.apply_scale(normed, self.scale(), x.dtype)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual += x`` (in place), then the norm of the sum."""
        kernels = row_kernels(x)
        if kernels is not None and residual.dtype == torch.float32 and residual.is_contiguous():
            return kernels.rms_norm(x, self._cached_scale(), self.eps, residual=residual)
        return self.forward(residual.add_(x))

    def norm_(self, x: torch.Tensor) -> torch.Tensor:
        """The norm of contiguous ``x`` written over ``x`` (a fresh tensor nobody else reads)."""
        kernels = row_kernels(x)
        if kernels is not None and x.is_contiguous():
            return kernels.rms_norm(x, self._cached_scale(), self.eps, out=x)
        return self.forward(x)

    def scale(self) -> torch.Tensor:
        return 1.0 + self.weight.float()

    def _cached_scale(self) -> torch.Tensor:
        """``scale()`` kept while the weight is unchanged (same tensor, same version)."""
        w = self.weight
        key = (w.data_ptr(), tensor_version(w), w.dtype.itemsize)
        if key != self._scale_key:
            self._scale, self._scale_key = self.scale().contiguous(), key
        return self._scale

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

    def forward(self, x: torch.Tensor, gate: torch.Tensor, scratch: bool = False) -> torch.Tensor:
        """``scratch``: x is the caller's own buffer, which the native kernel may overwrite
        with the result."""
        if x.dim() == 2 and x.dtype == gate.dtype == self.weight.dtype == torch.float32:
            kernels = None if torch.is_grad_enabled() else load_ssm_prefill()
            if kernels is not None:  # one pass per token (native/ssm_prefill.c)
                first = not self.norm_before_gate
                groups, eps, w = self.num_groups, self.eps, self.weight
                in_place = scratch and x.is_contiguous()
                return kernels.gated_rms_norm(x, gate, w, groups, eps, first, in_place)
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

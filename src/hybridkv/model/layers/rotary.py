"""Rotary position embedding with a cos/sin table computed once and grown on demand."""

from __future__ import annotations

import torch
from torch import nn

from hybridkv.model.config.rope import RopeConfig
from hybridkv.native.rownorm import RowKernels, load_rownorm


class RotaryTable(nn.Module):
    """cos/sin rows for positions ``[0, len)``, float32, in the ``cat(freqs, freqs)`` layout;
    the first half of each sin row is negated (see ``RotaryCosSin``).

    NOTE: the tables are plain float32 attributes, not buffers, so ``model.to(bfloat16)``
    leaves them exact; they are built on the CPU even under a ``meta`` device context.
    """

    def __init__(self, cfg: RopeConfig, initial_len: int = 4096) -> None:
        super().__init__()
        cpu = torch.device("cpu")
        with torch.device(cpu):
            self.inv_freq = cfg.inv_freq()  # [dim / 2]
        self.scaling = cfg.attention_scaling
        self.cos = torch.empty(0, cfg.dim, device=cpu)
        self.sin = torch.empty(0, cfg.dim, device=cpu)
        self._grow(initial_len)

    def _grow(self, length: int) -> None:
        pos = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
        freqs = pos[:, None] * self.inv_freq[None, :]  # [len, dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [len, dim]
        self.cos, self.sin = emb.cos(), emb.sin()
        if self.scaling != 1.0:  # YaRN
            self.cos, self.sin = self.cos * self.scaling, self.sin * self.scaling
        self.sin[:, : freqs.shape[1]].neg_()  # rotate_half's negation, folded into the table

    def lookup(self, positions: torch.Tensor, max_pos: int, dtype: torch.dtype) -> RotaryCosSin:
        """cos/sin of each token, ``[T, 1, dim]`` (broadcast over heads), cast to ``dtype``."""
        if max_pos >= self.cos.shape[0]:
            self._grow(max(2 * self.cos.shape[0], max_pos + 1))
        if self.cos.device != positions.device:
            self.inv_freq, self.cos, self.sin = (
                t.to(positions.device) for t in (self.inv_freq, self.cos, self.sin)
            )
        cos = self.cos[positions].to(dtype)[:, None, :]  # [T, 1, dim]
        sin = self.sin[positions].to(dtype)[:, None, :]  # [T, 1, dim], first half negated
        rope = RotaryCosSin(cos, sin)
        if (
            dtype == torch.float32
            and not torch.is_grad_enabled()
            and positions.device.type == "cpu"
        ):
            kernels = load_rownorm()
            if kernels is not None:  # every position < max_pos + 1 <= the tables' length
                rope.native = _NativeRope(kernels, self.cos, self.sin, positions.contiguous())
        return rope


class _NativeRope:
    """What the in-place rotary kernel reads: the whole tables and the step's positions."""

    __slots__ = ("kernels", "cos", "signed_sin", "positions")

    def __init__(
        self, kernels: RowKernels, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
    ) -> None:
        self.kernels, self.cos, self.signed_sin, self.positions = kernels, cos, sin, positions


class RotaryCosSin:
    """``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``, computed as
    ``x * cos + cat(x2, x1) * signed_sin`` (the same products, one op fewer)."""

    __slots__ = ("cos", "signed_sin", "native")

    def __init__(self, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
        self.cos = cos
        self.signed_sin = signed_sin
        self.native: _NativeRope | None = None  # set by ``RotaryTable.lookup``

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``[T, heads, head_dim]`` by its tokens' positions: all of each head, or
        its first ``dim`` dims (partial rotary), the rest passing through. float32 ``x`` whose
        heads are packed (strides ``(any, head_dim, 1)``) is rotated in place by the native
        kernel and returned: callers pass a tensor of their own."""
        native = self.native
        if native is not None and x.dtype == torch.float32:
            stride = x.stride()
            if stride[2] == 1 and stride[1] == x.shape[2]:
                native.kernels.rope_(x, native.cos, native.signed_sin, native.positions)
                return x
        dim = self.cos.shape[-1]
        if dim < x.shape[-1]:
            return torch.cat((self._rotate(x[..., :dim]), x[..., dim:]), dim=-1)
        return self._rotate(x)

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)  # [T, heads, dim]
        return x * self.cos + swapped * self.signed_sin

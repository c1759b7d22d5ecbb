"""Several projections of the same input as one matmul (q/k/v; gate/up).

The modules keep their own ``nn.Linear`` parts, so checkpoint names and the loader are
unchanged. On first use the parts' weights are concatenated (dim 0) and the parts' parameters
re-pointed to views of the concatenation: no second copy of the weights. When a part's tensor
is replaced (a fresh load, ``model.to(dtype)``) the concatenation is rebuilt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from hybridkv.model.layers.linear import ProjectionGemm

_Key = tuple[int, ...]


class FusedLinear:
    """``[..., in] -> [..., sum(out_i)]``: the parts' outputs side by side, in order.

    NOTE: a plain object, not a module: the parts are registered by their owner already.
    """

    def __init__(self, parts: Sequence[nn.Linear]) -> None:
        self.parts = tuple(parts)
        self.sizes = [p.out_features for p in self.parts]
        self._cache = _Concat(
            lambda: [p.weight for p in self.parts],
            lambda: [p.bias for p in self.parts],
        )
        self._gemm = ProjectionGemm()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        formats = {getattr(p, "quant", None) for p in self.parts}  # GGUF blocks: Linear.quant
        if len(formats) > 1:  # e.g. Q4_K q/k with a Q6_K v: no common layout to fuse
            return torch.cat([p(x) for p in self.parts], dim=-1)
        weight, bias = self._cache.get()  # quantized rows concatenate as bytes
        return self._gemm(x, weight, bias, formats.pop())

    def concatenated(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight (and bias) ``__call__`` multiplies by when the parts share a format."""
        return self._cache.get()


class _Concat:
    """Concatenated weights (and biases, if every part has one), rebuilt when a part moves."""

    def __init__(
        self,
        weights: Callable[[], list[torch.Tensor]],
        biases: Callable[[], list[torch.Tensor | None]],
    ) -> None:
        self._weights = weights
        self._biases = biases
        self._key: _Key = ()
        self._weight = torch.empty(0)
        self._bias: torch.Tensor | None = None

    def get(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self._key != self._current_key():
            self._weight = _concat_and_repoint(self._weights())
            biases = self._biases()
            present = [b for b in biases if b is not None]
            self._bias = _concat_and_repoint(present) if len(present) == len(biases) else None
            if present and self._bias is None:
                raise ValueError("fusing projections where only some have a bias")
            self._key = self._current_key()
        return self._weight, self._bias

    def _current_key(self) -> _Key:
        params = [*self._weights(), *self._biases()]
        return tuple(p.data_ptr() if p is not None else -1 for p in params)


def _concat_and_repoint(params: Sequence[torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():
        whole = torch.cat([p.detach() for p in params], dim=0)
        start = 0
        for p in params:
            p.data = whole[start : start + p.shape[0]]
            start += p.shape[0]
    return whole

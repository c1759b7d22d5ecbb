"""Mixture-of-experts dispatch and the routers of the MoE families.

``dispatch`` runs each expert once on the tokens routed to it: the (token, choice) pairs are
sorted by expert so every expert reads one contiguous slice, and the weighted outputs are put
back in (token, choice) order by the inverse permutation and summed over the k choices. No
``index_add_`` (serialised scatter-adds, ~2x slower than the dense matmuls on CPU).

``expert_linear`` multiplies by one expert of a stack, float or kept in its GGUF blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.layers.linear import linear
from hybridkv.model.layers.quant_linear import quant_linear

ExpertFn = Callable[[int, torch.Tensor], torch.Tensor]


def dispatch(
    x: torch.Tensor,
    top_idx: torch.Tensor,
    weights: torch.Tensor,
    num_experts: int,
    expert: ExpertFn,
) -> torch.Tensor:
    """``x [T, H]``, ``top_idx``/``weights`` ``[T, k]`` -> ``sum_j weights[:, j] *
    expert(top_idx[:, j], x)`` ``[T, H]``; ``expert(e, rows)`` maps ``[n, H] -> [n, H]``."""
    num_tokens, k = top_idx.shape
    flat = top_idx.flatten()  # [T * k]
    order = flat.argsort(stable=True)  # (token, choice) pairs grouped by expert
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    routed = x[order // k]  # [T * k, H]
    out = torch.empty_like(routed)
    start = 0
    for e, count in enumerate(counts):
        if count:
            out[start : start + count] = expert(e, routed[start : start + count])
            start += count
    out = out * weights.flatten()[order, None].to(out.dtype)
    unsorted = torch.empty_like(out)
    unsorted[order] = out
    return unsorted.view(num_tokens, k, -1).sum(dim=1)


def expert_linear(x: torch.Tensor, stack: torch.Tensor, e: int) -> torch.Tensor:
    """``x @ stack[e]^T`` for an expert stack ``[E, out, in]``: float, or GGUF blocks kept
    quantized (uint8 ``[E, out, row_bytes]``, its format in ``stack.quant``:
    ``quant_linear.set_quantized_experts``) multiplied by the quantized kernels."""
    fmt = getattr(stack, "quant", None)
    if fmt is None:
        return linear(x, stack[e])
    return quant_linear(x, stack[e], fmt)


def softmax_top_k(logits: torch.Tensor, k: int, renormalize: bool) -> tuple[torch.Tensor, ...]:
    """Softmax over all experts, the top k, optionally renormalised to sum to 1 (Qwen MoE)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, idx = probs.topk(k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, idx


class ExpertTensor(nn.Module):
    """Expert weights stored as one ``[E, out, in]`` parameter named ``weight``."""

    def __init__(self, num_experts: int, out_dim: int, in_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, out_dim, in_dim))


def silu_gated(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of a ``[..., 2I]`` gate|up concatenation."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up

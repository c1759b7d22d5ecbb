"""Batched logits processors, vLLM's semantics, one tensor op per option for the whole batch.

Every function takes ``logits [R, V]`` float32 (the rows that use the option) and returns the
processed rows; none loops over the vocabulary in Python. Order (the sampler's, as vLLM's):
grammar bitmask, allowed_token_ids, bad words, min_tokens, logit_bias, penalties; then, for
sampled rows only, temperature, min_p, top-k, top-p.
"""

from __future__ import annotations

import numpy as np
import torch

NEG_INF = float("-inf")


def apply_penalties(
    logits: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
) -> torch.Tensor:
    """``output_counts [R, V]`` (how often each token was generated), ``prompt_mask [R, V]``
    (token occurs in the prompt), per-row penalties ``[R]``. Repetition divides positive
    logits of every prompt or output token by the penalty and multiplies negative ones;
    frequency subtracts ``penalty * count``, presence ``penalty`` once, over output tokens."""
    generated = output_counts > 0  # [R, V]
    if bool((repetition != 1.0).any()):
        rep = repetition[:, None]
        penalised = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(prompt_mask | generated, penalised, logits)
    if bool((frequency != 0.0).any()):
        logits = logits - frequency[:, None] * output_counts.to(logits.dtype)
    if bool((presence != 0.0).any()):
        logits = logits - presence[:, None] * generated.to(logits.dtype)
    return logits


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the most likely one's (rows
    already divided by their temperature)."""
    probs = torch.softmax(logits, dim=-1)  # [R, V]
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    return logits.masked_fill(probs < threshold, NEG_INF)


def apply_allowed(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``allowed [R, V]`` bool: every other token is masked."""
    return logits.masked_fill(~allowed, NEG_INF)


def apply_bias(
    logits: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, values: torch.Tensor
) -> torch.Tensor:
    """Add ``values[i]`` to ``logits[rows[i], ids[i]]`` (logit_bias, flattened over rows)."""
    return logits.index_put((rows, ids), values, accumulate=True)


def apply_ban(logits: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mask ``logits[rows[i], ids[i]]`` (min_tokens' stop tokens, bad words' last tokens)."""
    if rows.numel() == 0:
        return logits
    return logits.index_put((rows, ids), torch.tensor(NEG_INF))


def apply_token_bitmask(logits: torch.Tensor, bitmask: np.ndarray) -> torch.Tensor:
    """``bitmask [R, ceil(V/32)]`` int32, bit j of word w allows token ``32 w + j`` (one
    ``unpackbits`` over the little-endian words)."""
    vocab = logits.shape[-1]
    words = np.ascontiguousarray(bitmask, dtype="<i4")
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    return logits.masked_fill(torch.from_numpy(bits) == 0, NEG_INF)


def apply_top_k(logits: torch.Tensor, top_ks: list[int]) -> torch.Tensor:
    if not any(top_ks):
        return logits
    vocab = logits.shape[-1]
    ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks])  # [S]
    sorted_desc = logits.sort(dim=-1, descending=True).values  # [S, V]
    kth = sorted_desc.gather(1, (ks - 1)[:, None])  # [S, 1]
    return logits.masked_fill(logits < kth, NEG_INF)


def apply_top_p(logits: torch.Tensor, top_ps: list[float]) -> torch.Tensor:
    if all(p >= 1.0 for p in top_ps):
        return logits
    ps = torch.tensor(top_ps, dtype=torch.float32)[:, None]  # [S, 1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [S, V]
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # [S, V]
    drop_sorted = mass_before >= ps  # keep the smallest prefix whose mass reaches p
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)

"""What a state checkpoint is worth: the prefill work it saves, times how likely it is to be
used, per byte held (every checkpoint of a state group holds the same bytes, so the book
compares work alone).

*Work* (``recompute_cost``): recomputing tokens [a, b) costs one unit per token for the
projections and the state scan, plus attention that grows with the position (a token at
position p reads p keys): ``(b - a) + (b^2 - a^2) / (2 * ATTENTION_TOKENS)``. A checkpoint at
boundary T whose nearest cached ancestor on the same prefix sits at A saves
``recompute_cost(A, T)`` to a request that resumes at T (without it, the request resumes at A).
"""

from __future__ import annotations

# The position where a token's attention costs as much as the rest of its layer stack. On the
# hybrids served here (1 attention layer in 4-8) it is far out; only the ratio matters.
ATTENTION_TOKENS = 8192


def recompute_cost(start: int, end: int) -> float:
    """Prefill work of tokens [start, end), in tokens at position 0."""
    return (end - start) + (end * end - start * start) / (2 * ATTENTION_TOKENS)

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

from dataclasses import dataclass, field

from hybridkv.kv.block_pool import CacheKey
from hybridkv.kv.checkpoints import CheckpointKind
from hybridkv.kv.hashing import BlockHash

# The position where a token's attention costs as much as the rest of its layer stack. On the
# hybrids served here (1 attention layer in 4-8) it is far out; only the ratio matters.
ATTENTION_TOKENS = 8192


def recompute_cost(start: int, end: int) -> float:
    """Prefill work of tokens [start, end), in tokens at position 0."""
    return (end - start) + (end * end - start * start) / (2 * ATTENTION_TOKENS)


# Before any reuse is seen: the chance that a new checkpoint of each kind is where a later
# request resumes. Caller boundaries and junctions name heads other requests share (the first
# sharer should hit them at once); prompt ends serve a prompt sent again; periodic ones only
# a request that leaves a long prompt between two boundaries.
PRIOR_REUSE = {
    CheckpointKind.PERIODIC: 0.2,
    CheckpointKind.PROMPT: 0.4,
    CheckpointKind.JUNCTION: 0.6,
    CheckpointKind.CALLER: 0.6,
    CheckpointKind.FINISHED: 0.15,
    CheckpointKind.TURN_END: 0.8,
}
PRIOR_WEIGHT = 4.0  # the priors count as this many observed checkpoints
MAX_BUCKET = 2  # hits counted 0, 1, 2 or more
MIN_LINK_SHARE = 0.1  # of a link's expected reuse (a head shared two ways is not a link)


@dataclass(slots=True)
class CheckpointEntry:
    """The book's record of one checkpoint (``CheckpointBook.entries``, by slot)."""

    key: CacheKey
    boundary: int
    kind: CheckpointKind
    prefix: tuple[BlockHash, ...]  # the block hashes before the boundary's own
    hits: int = 0  # requests that resumed here (or would have: the deepest within overlap)
    stamp: int = 0  # last registration or hit (a clock of arrivals, not time)
    ancestor: int = 0  # boundary of the deepest other cached checkpoint on the prefix


@dataclass(slots=True)
class ReuseRates:
    """Expected further reuses of a checkpoint of a kind that served ``hits`` so far, learned
    from where requests actually resume (``offered`` / ``reused``), smoothed by the priors.

    ``offered[kind, h]``: checkpoints of that kind that reached ``h`` reuses (every due one is
    counted when made, kept or not; the others as their hits come); ``reused[kind, h]``: how
    many times one of them was where a request's overlap ended. The ratio is a probability
    for h < 2 (did it get one more) and a mean count from 2 on."""

    offered: dict[tuple[CheckpointKind, int], int] = field(default_factory=dict)
    reused: dict[tuple[CheckpointKind, int], int] = field(default_factory=dict)

    def expected(self, kind: CheckpointKind, hits: int) -> float:
        """Expected further reuses; a bucket with no evidence yet takes the one below as its
        prior (a checkpoint that served a hit is worth what a new one is until seen)."""
        b = min(hits, MAX_BUCKET)
        prior = PRIOR_REUSE[kind] if b == 0 else self.expected(kind, b - 1)
        num = self.reused.get((kind, b), 0) + PRIOR_WEIGHT * prior
        return num / (self.offered.get((kind, b), 0) + PRIOR_WEIGHT)

    def offer(self, kind: CheckpointKind, hits: int) -> None:
        """A checkpoint of ``kind`` reached ``hits`` reuses (0: it was just made)."""
        if hits <= MAX_BUCKET:
            key = (kind, hits)
            self.offered[key] = self.offered.get(key, 0) + 1

    def reuse(self, kind: CheckpointKind, hits: int) -> None:
        """A request resumed (or would have) at a checkpoint of ``kind`` with ``hits`` so far."""
        key = (kind, min(hits, MAX_BUCKET))
        self.reused[key] = self.reused.get(key, 0) + 1
        self.offer(kind, hits + 1)


@dataclass(slots=True)
class Ghost:
    kind: CheckpointKind
    hits: int


class Ghosts:
    """Checkpoints the book evicted or refused, remembered by key (no state) so a later
    request that would have resumed there still teaches the rates, and the checkpoint comes
    back with its hits when it is made again (second-hit admission). Oldest forgotten first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: dict[BlockHash, Ghost] = {}

    def remember(self, key: BlockHash, kind: CheckpointKind, hits: int) -> None:
        self.items.pop(key, None)
        self.items[key] = Ghost(kind, hits)
        if len(self.items) > self.capacity:
            del self.items[next(iter(self.items))]

    def take(self, key: BlockHash) -> Ghost | None:
        return self.items.pop(key, None)

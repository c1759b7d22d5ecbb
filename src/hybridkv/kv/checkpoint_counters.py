"""What a state group's checkpoint book did, counted (totals since start; the engine sums
them over state groups into ``EngineStats.checkpoints``, ``/metrics`` exports them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from hybridkv.kv.checkpoints import CheckpointKind


class EvictReason(Enum):
    VALUE = "value"  # displaced by a newcomer worth more
    SLOT = "slot"  # a live or trailing state needed the slot
    SUPERSEDED = "superseded"  # replaced by its request's newer state (checkpoint_admission)
    LOST = "lost"  # its key went by other means (reset, a failed load, an explicit evict)


@dataclass(slots=True)
class CheckpointCounters:
    admitted: dict[CheckpointKind, int] = field(default_factory=dict)
    # a due checkpoint not saved: the budget held only checkpoints worth more, or running
    # requests held all of it (the request ran on; this is the shortfall)
    refused: dict[CheckpointKind, int] = field(default_factory=dict)
    evicted: dict[EvictReason, int] = field(default_factory=dict)
    hits: dict[CheckpointKind, int] = field(default_factory=dict)  # restores, by kind

    def count_admitted(self, kind: CheckpointKind) -> None:
        self.admitted[kind] = self.admitted.get(kind, 0) + 1

    def count_refused(self, kind: CheckpointKind) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1

    def count_evicted(self, reason: EvictReason) -> None:
        self.evicted[reason] = self.evicted.get(reason, 0) + 1

    def count_hit(self, kind: CheckpointKind) -> None:
        self.hits[kind] = self.hits.get(kind, 0) + 1


@dataclass(frozen=True, slots=True)
class CheckpointStats:
    """Every state group's counters summed (keys: kind and reason names), and the bytes the
    checkpoints hold against the budget's (None: no budget, or no state groups)."""

    admitted: Mapping[str, int] = field(default_factory=dict)
    refused: Mapping[str, int] = field(default_factory=dict)
    evicted: Mapping[str, int] = field(default_factory=dict)
    hits: Mapping[str, int] = field(default_factory=dict)
    held_bytes: int = 0
    budget_bytes: int | None = None


def sum_counters(parts: Sequence[tuple[CheckpointCounters, int, int | None]]) -> CheckpointStats:
    """``(counters, bytes held, budget bytes)`` per state group -> one snapshot."""
    admitted: dict[str, int] = {}
    refused: dict[str, int] = {}
    evicted: dict[str, int] = {}
    hits: dict[str, int] = {}
    for c, _, _ in parts:
        for out, counts in ((admitted, c.admitted), (refused, c.refused), (hits, c.hits)):
            for kind, n in counts.items():
                out[kind.name.lower()] = out.get(kind.name.lower(), 0) + n
        for reason, n in c.evicted.items():
            evicted[reason.value] = evicted.get(reason.value, 0) + n
    budgets = [b for _, _, b in parts if b is not None]
    return CheckpointStats(
        admitted, refused, evicted, hits,
        held_bytes=sum(held for _, held, _ in parts),
        budget_bytes=sum(budgets) if budgets else None,
    )  # fmt: skip

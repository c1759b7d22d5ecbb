"""What a state group's checkpoint book did, counted (totals since start; the engine sums
them over state groups into ``EngineStats.checkpoints``, ``/metrics`` exports them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from hybridkv.kv.checkpoints import CheckpointKind


class EvictReason(Enum):
    VALUE = "value"  # displaced by a newcomer worth more
    SLOT = "slot"  # a live or trailing state needed the slot
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

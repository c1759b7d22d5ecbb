"""``Tier``: the contract every storage tier of the ``OffloadingConnector`` keeps.

A tier stores whole restore units (one part per group) somewhere: CPU memory, local files, a
remote store. ``stack.TierStack`` orders the tiers fastest first and owns what spans them
(write-through, promotion, adoption); the connector halves talk to the stack only.

Threads and where each call may run::

    scheduler thread   lookup, probe, confirm, take_found, mark_absent, reserve, evict, pin/unpin,
                       touch (through ``index``) -- memory only, never I/O, never blocks
    worker threads     read, read_unit, write, discard_bad, submit, stats

The rules a tier must keep (the rest of the package relies on them):

- **Lookups answer from memory.** ``lookup`` reads the in-memory ``index`` only. Finding units
  that another process stored (``probe``) may start I/O on the tier's own workers, but answers
  at once: ``ASKING`` while it does not know yet (the scheduler then says "ask again").
- **Residency is the index's.** A unit is reported READY only after ``write`` (or an adoption)
  committed it; ``reserve`` is the only call that evicts, and the scheduler half makes it only
  while planning saves, after the step's loads pinned what their lookups reported.
- **Every byte is verified.** ``read`` returns a part's payload only after checking it
  against the checksum taken when it was stored; otherwise ``PartError`` with a reason
  (``file.format``'s constants). A tier may still lose a READY unit underneath (another process
  deletes a file, a remote store evicts a value): that is a ``missing`` read, which the worker
  counts and recovers from by recompute.
- **A failed write completes the unit as failed.** ``write`` either commits the reserved unit
  or raises; the caller then aborts the reservation, so a failed store is never visible.
- **Bounded waits.** No call on a worker blocks longer than the tier's own timeout; a tier
  with I/O runs it on its own bounded workers and gives up on (and quarantines) a call that
  does not return, so one stuck file never stalls the rest; ``shutdown`` returns within a few
  seconds whatever the storage does.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from hybridkv.connectors.offloading.tier import ResidentUnit, TierIndex, UnitState
from hybridkv.connectors.offloading.units import UnitGeometry
from hybridkv.kv.hashing import BlockHash
from hybridkv.kv.spec import SpecKind


class TierCounts:
    """Counters a tier's own I/O threads keep, by name (``take`` drains them). The worker folds
    them into ``OffloadingStats.tier_counters`` at each ``take_stats``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, float] = {}

    def add(self, name: str, value: float = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + value

    def take(self) -> dict[str, float]:
        with self._lock:
            counts, self._counts = self._counts, {}
        return counts


class ProbeAnswer(Enum):
    ABSENT = "absent"  # not in this tier (as far as it knows now)
    FOUND = "found"  # stored by another process: adopted at the next ``take_found``
    ASKING = "asking"  # being checked on the tier's workers: ask again next step


@dataclass(frozen=True, slots=True)
class UnitRef:
    """A unit as a lookup sees it: its key, its end T, and the unit ending C tokens earlier."""

    unit_hash: BlockHash
    end: int
    parent: BlockHash | None


@dataclass(frozen=True, slots=True)
class TierStats:
    """A tier's residency now (a gauge, not a counter)."""

    name: str  # its registry entry's (``tier_registry``): a TierName for a built-in
    units: int
    used_bytes: int
    capacity_bytes: int
    pinned: int
    pending: int


class Tier(ABC):
    """One storage tier. Subclasses set ``name``, ``index`` and ``geometry`` (see the module docstring for
    which thread may call what)."""

    name: str  # its registry entry's (``tier_registry``): a TierName for a built-in
    index: TierIndex
    geometry: UnitGeometry
    # parts are CPU tensors checksummed per segment (``tiers.cpu.tier.CpuPart``): loads copy them
    # segment by segment, with no I/O (a synchronous load runs on the caller's thread)
    in_memory: bool = False
    # counter of stored objects (files, values) a bad unit's ``discard_bad`` deleted
    removed_counter: str | None = None
    # called by the tier's workers when a probe finished (set by the worker half)
    progress: Callable[[], None] | None = None

    # -- scheduler thread: memory only ----------------------------------------------------

    def lookup(self, unit_hash: BlockHash) -> UnitState | None:
        """READY / PENDING (being stored) / None, from the in-memory index only."""
        return self.index.state_of(unit_hash)

    def probe(self, units: Sequence[UnitRef]) -> ProbeAnswer:
        """Whether ``units[0]``, which no tier's index holds, was stored by another process.
        ``units[1:]`` are the request's following units, which the tier may check in the same
        round trip. Never blocks on I/O. By default a tier only knows its own units."""
        return ProbeAnswer.ABSENT

    def confirm(self, units: Sequence[UnitRef]) -> int | None:
        """How many of ``units`` (READY in this tier's index, the run a lookup is about to
        report, in order) the tier can still serve; None while it checks (ask again). Never
        blocks on I/O. A tier whose index is the truth (memory, files this process indexes)
        confirms them all; the remote tier asks the server (its values may be evicted)."""
        return len(units)

    def probing(self) -> bool:
        """Whether a probe is still checking on the tier's worker (the engine then waits for
        ``progress`` instead of spinning through empty steps)."""
        return False

    def take_found(self) -> list[UnitRef]:
        """Units ``probe`` found since the last call, to adopt (reserve + ``adopted``)."""
        return []

    def mark_absent(self, unit_hash: BlockHash) -> None:
        """A found unit could not be adopted (no room): do not report it found for a while."""
        return None

    def adopted_parts(self, unit: UnitRef) -> dict[int, Any]:
        """The index entry's ``parts`` of a unit adopted from another process."""
        return {}

    def reserve(
        self, unit_hash: BlockHash, end: int, nbytes: int, parent: BlockHash | None
    ) -> list[ResidentUnit] | None:
        """Add a PENDING entry, evicting per the policy; the evicted entries (hand them to
        ``evict``), or None if the unit is known already or there is no room."""
        return self.index.reserve(unit_hash, end, nbytes, parent)

    def evict(self, entries: list[ResidentUnit]) -> None:
        """Drop the bytes of units ``reserve`` evicted (may queue I/O on the tier's workers,
        ordered before any later write of the same unit)."""
        return None

    # -- worker threads ----------------------------------------------------------------------

    @abstractmethod
    def read(
        self, unit_hash: BlockHash, end: int, group_id: int, deadline: float | None = None
    ) -> torch.Tensor:
        """One part's payload (flat uint8, or the tier's own shape), verified; ``PartError``
        with the reason otherwise. ``deadline`` (``time.monotonic()``): the load's, which no
        I/O of this read may outlive (``PartError(TIMEOUT)``); memory reads ignore it."""

    def read_unit(self, unit_hash: BlockHash, end: int) -> dict[int, torch.Tensor]:
        """Every part of a unit, verified, attention parts ``[n, G, layer_page_bytes]`` and
        state parts flat (as the CPU tier keeps them); ``PartError`` otherwise."""
        layout = self.geometry.layout
        parts = {}
        for group in layout.groups:
            data = self.read(unit_hash, end, group.group_id)
            if group.kind is SpecKind.STATE:
                parts[group.group_id] = data.reshape(-1)
            else:
                parts[group.group_id] = data.view(-1, layout.group_size, layout.layer_page_bytes)
        return parts

    @abstractmethod
    def write(self, unit_hash: BlockHash, end: int, parts: dict[int, Any]) -> int:
        """Store a reserved unit's parts and commit it; returns the bytes written. Raises on
        failure (the caller aborts the reservation). A reservation dropped meanwhile is not
        an error: nothing stays stored."""

    def discard_bad(self, unit_hash: BlockHash, reason: str) -> int:
        """Forget a unit a read found bad and delete its stored objects (unless ``reason``
        says they are gone or unreadable); returns how many were deleted."""
        self.index.remove(unit_hash)
        return 0

    def submit(self, fn: Callable[[], Any], key: Hashable | None = None) -> Future[Any]:
        """Run ``fn`` on the tier's I/O workers, after the I/O of the same ``key`` (a unit
        hash) queued before it (a tier without I/O runs it now, on the caller's thread)."""
        future: Future[Any] = Future()
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)
        return future

    def take_counters(self) -> dict[str, float]:
        """Counters the tier's own threads kept since the last call (stuck I/O...)."""
        return {}

    def stats(self) -> TierStats:
        index = self.index
        with index.lock:
            return TierStats(
                self.name,
                len(index.entries),
                index.used,
                index.capacity,
                index.num_pinned(),
                index.num_pending(),
            )

    def shutdown(self) -> None:
        """Stop and join the tier's threads (within a few seconds whatever the storage does)
        and free its memory and connections; called once, after the worker's load threads
        were told to stop. Nothing is called on the tier afterwards."""
        return None

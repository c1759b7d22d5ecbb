"""``TierStack``: the configured tiers, fastest first, and what spans them.

::

    cpu  (memory)  -- write-through -->  disk (files)  -- write-through -->  remote (Valkey)
         ^------------------------ promotion of a hit -------------------------'

- **Lookup**: a unit is READY if some tier holds it, else PENDING if one is storing it.
- **Loads** pin each unit in the fastest tier holding it.
- **Write-through**: a save reserves the unit in every tier (the only place tiers evict); the
  worker stores it in the fastest reserved tier first, then each slower one on its own I/O
  worker (``stores.StorePipeline``).
- **Promotion**: a unit loaded from a slower tier is copied into the fastest one the next step
  (reserved there by the scheduler half, read whole and verified by the worker).
- **Adoption**: units another process stored (found by a tier's ``probe``) enter that tier's
  index in ``build_connector_meta``, where reservations may evict.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from hybridkv.connectors.offloading.tier import ResidentUnit, UnitState
from hybridkv.connectors.offloading.tier_base import ProbeAnswer, Tier, TierStats, UnitRef
from hybridkv.connectors.tier_events import TierEvent, TierEventSink
from hybridkv.kv.hashing import BlockHash


class TierStack:
    def __init__(self, tiers: Sequence[Tier]) -> None:
        if not tiers:
            raise ValueError("OffloadingConnector: at least one tier is required")
        self.tiers = tuple(tiers)
        self._by_name = {t.name: t for t in self.tiers}

    def __iter__(self) -> Iterator[Tier]:
        return iter(self.tiers)

    def get(self, name: str | None) -> Tier | None:
        return None if name is None else self._by_name.get(name)

    @property
    def fastest(self) -> Tier:
        return self.tiers[0]

    # -- scheduler thread ----------------------------------------------------------------

    def state_of(self, unit_hash: BlockHash) -> UnitState | None:
        """READY if some tier can serve the unit, else PENDING if one is storing it."""
        states = {tier.lookup(unit_hash) for tier in self.tiers}
        if UnitState.READY in states:
            return UnitState.READY
        return UnitState.PENDING if UnitState.PENDING in states else None

    def probe(self, units: Sequence[UnitRef]) -> ProbeAnswer:
        """Ask each tier (fastest first) whether another process stored ``units[0]``."""
        answers = {tier.probe(units) for tier in self.tiers}
        for answer in (ProbeAnswer.FOUND, ProbeAnswer.ASKING):
            if answer in answers:
                return answer
        return ProbeAnswer.ABSENT

    def confirm(self, units: Sequence[UnitRef]) -> int | None:
        """How many of ``units`` (a lookup's READY run, in order) the fastest tier holding
        each still confirms, from the first; None while a tier is asking."""
        by_tier: dict[str, list[int]] = {}
        for i, unit in enumerate(units):
            holder = next(t for t in self.tiers if t.lookup(unit.unit_hash) is UnitState.READY)
            by_tier.setdefault(holder.name, []).append(i)
        cut: int | None = len(units)
        for name, indices in by_tier.items():
            num = self._by_name[name].confirm([units[i] for i in indices])
            if num is None:
                cut = None
            elif cut is not None and num < len(indices):
                cut = min(cut, indices[num])
        return cut

    def pin_fastest(self, unit_hash: BlockHash) -> tuple[Tier, int] | None:
        """Pin the unit in the fastest tier holding it: (tier, the pinned entry's serial)."""
        for tier in self.tiers:
            serial = tier.index.pin(unit_hash)
            if serial is not None:
                return tier, serial
        return None

    def touch(self, unit_hash: BlockHash, reuse: bool = False) -> None:
        for tier in self.tiers:
            tier.index.touch(unit_hash, reuse)

    def resume(self, unit_hash: BlockHash) -> None:
        """A load resumes at this unit: every tier holding it counts the hit."""
        for tier in self.tiers:
            tier.index.resume(unit_hash)

    def reserve(
        self, tier: Tier, unit_hash: BlockHash, end: int, nbytes: int, parent: BlockHash | None
    ) -> int | None:
        """Reserve a unit in one tier; the number of units evicted for it (their bytes
        dropped by the tier), or None if it could not be reserved."""
        evicted = tier.reserve(unit_hash, end, nbytes, parent)
        if evicted is None:
            return None
        if evicted:
            tier.evict(evicted)
        return len(evicted)

    def promotion_target(self, source: str) -> Tier | None:
        """Where a hit served by tier ``source`` is copied: the fastest tier, if slower."""
        return None if source == self.fastest.name else self.fastest

    # -- worker threads ------------------------------------------------------------------

    def unpin(self, name: str | None, unit_hash: BlockHash, serial: int | None) -> None:
        tier = self.get(name)
        if tier is not None:
            tier.index.unpin(unit_hash, serial)

    def stats(self) -> list[TierStats]:
        return [tier.stats() for tier in self.tiers]

    # -- KV events and resets (scheduler thread) ------------------------------------------

    def set_event_sink(self, sink: TierEventSink, unit_tokens: int) -> None:
        for tier in self.tiers:
            tier.index.listener = _Relay(tier.name, sink, unit_tokens)

    def resident_units(self, unit_tokens: int) -> list[TierEvent]:
        return [
            _event(t.name, e, True, unit_tokens)
            for t in self.tiers
            for e in t.index.ready_entries()
        ]

    def reset(self) -> int:
        """Drop every unit neither pinned nor being stored, bytes too; how many."""
        num = 0
        for tier in self.tiers:
            gone = tier.index.clear()
            if gone:
                tier.evict(gone)
            num += len(gone)
        return num

    def check_accounting(self) -> None:
        for tier in self.tiers:
            tier.index.check_accounting()

    def shutdown(self) -> None:
        for tier in self.tiers:
            tier.shutdown()


class _Relay:
    """A tier index's listener: its changes as ``TierEvent``s of one tier."""

    def __init__(self, tier: str, sink: TierEventSink, unit_tokens: int) -> None:
        self.tier, self.sink, self.unit_tokens = tier, sink, unit_tokens

    def __call__(self, entry: ResidentUnit, stored: bool) -> None:
        self.sink(_event(self.tier, entry, stored, self.unit_tokens))


def _event(tier: str, entry: ResidentUnit, stored: bool, unit_tokens: int) -> TierEvent:
    return TierEvent(stored, tier, entry.unit_hash, entry.end, entry.parent, unit_tokens)

"""Property test (issue 29): a tier index ordered by value (``ValuePolicy``) under any sequence
of reservations, commits, aborts, pins, hits and removals keeps its accounting, never evicts
a pinned or pending unit or a unit with a resident child, orders its candidates least worth
first, and ``victims_rank`` (what a save's value check asks) changes nothing and agrees
with what ``reserve`` then does."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hybridkv.connectors.offloading.policies import ValuePolicy
from hybridkv.connectors.offloading.tier import TierIndex, UnitState
from hybridkv.kv.checkpoints import CheckpointKind
from hybridkv.kv.hashing import BlockHash

PREFIXES, DEPTH = 3, 4


def key(prefix: int, depth: int) -> BlockHash:
    return BlockHash(bytes([prefix, depth]))


def parent(prefix: int, depth: int) -> BlockHash | None:
    return key(prefix, depth - 1) if depth > 1 else None


class TierMachine(RuleBasedStateMachine):
    index: TierIndex
    policy: ValuePolicy

    @initialize(capacity=st.integers(2, 8), horizon=st.integers(1, 3))
    def setup(self, capacity: int, horizon: int) -> None:
        self.policy = ValuePolicy(horizon)
        self.index = TierIndex("cpu", capacity, self.policy)
        self.pins: list[tuple[BlockHash, int]] = []

    @rule(
        prefix=st.integers(0, PREFIXES - 1),
        depth=st.integers(1, DEPTH),
        nbytes=st.integers(1, 3),
        kind=st.sampled_from(list(CheckpointKind)),
    )
    def reserve(self, prefix: int, depth: int, nbytes: int, kind: CheckpointKind) -> None:
        unit, before = key(prefix, depth), dict(self.index.entries)
        ranks = {k: self.policy.rank(k) for k in before}
        orphans = set(self.index.orphans)
        children = {k: set(v) for k, v in self.index.children.items()}
        floor = self.index.victims_rank(nbytes)
        assert self.index.entries == before  # asking changes nothing
        self.policy.label(unit, kind)
        victims = self.index.reserve(unit, depth, nbytes, parent(prefix, depth))
        if unit in before:
            assert victims is None
            return
        assert (victims is None) == (floor is None)
        gone = {v.unit_hash for v in victims or ()}
        for v in victims or ():
            assert v.pins == 0 and v.state is UnitState.READY  # never pinned or pending
            assert children.get(v.unit_hash, set()) <= gone  # a leaf, or its children go too
            assert floor is not None and (v.unit_hash in orphans or ranks[v.unit_hash] <= floor)
        if victims is not None:
            assert self.policy.of[unit] == (kind, 0)

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        pending = [k for k, e in self.index.entries.items() if e.state is UnitState.PENDING]
        if pending:
            unit = data.draw(st.sampled_from(pending))
            assert self.index.commit(unit, {})

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        pending = [k for k, e in self.index.entries.items() if e.state is UnitState.PENDING]
        if pending:
            unit = data.draw(st.sampled_from(pending))
            self.index.abort(unit)
            assert unit not in self.index.entries and unit not in self.policy.of

    @rule(data=st.data(), reuse=st.booleans())
    def pin_or_touch(self, data: st.DataObject, reuse: bool) -> None:
        ready = [k for k, e in self.index.entries.items() if e.state is UnitState.READY]
        if not ready:
            return
        unit = data.draw(st.sampled_from(ready))
        hits = self.policy.of[unit][1]
        self.index.touch(unit, reuse)  # recency only
        assert self.policy.of[unit][1] == hits
        if data.draw(st.booleans()):
            self.index.resume(unit)  # a load resumed here: a hit
            assert self.policy.of[unit][1] == min(hits + 1, 2)
        if data.draw(st.booleans()):
            serial = self.index.pin(unit)
            assert serial is not None
            self.pins.append((unit, serial))

    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        if self.pins:
            i = data.draw(st.integers(0, len(self.pins) - 1))
            self.index.unpin(*self.pins.pop(i))

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        if self.index.entries:
            unit = data.draw(st.sampled_from(sorted(self.index.entries)))
            self.index.remove(unit)
            self.pins = [p for p in self.pins if p[0] != unit]

    @invariant()
    def accounting_and_order(self) -> None:
        self.index.check_accounting()
        assert set(self.policy.of) == set(self.index.entries)
        assert all(m for m in self.policy.classes.values())  # no empty class kept
        ranks = [self.policy.rank(k) for k in self.policy.candidates()]
        assert ranks == sorted(ranks)  # stale first, then least worth first

    def teardown(self) -> None:
        for unit, serial in self.pins:
            self.index.unpin(unit, serial)
        for unit in list(self.index.entries):
            if self.index.entries[unit].state is UnitState.PENDING:
                self.index.abort(unit)
        self.index.clear()
        assert not self.index.entries and not self.policy.of and self.index.used == 0


FAST = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class TestTierMachine(TierMachine.TestCase):
    settings = FAST


@pytest.mark.slow
class TestTierMachineDeep(TierMachine.TestCase):
    settings = settings(FAST, max_examples=400, stateful_step_count=60)

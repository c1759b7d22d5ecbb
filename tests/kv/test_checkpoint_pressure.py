"""The KV state machine (``test_properties``) on state layouts under checkpoint pressure: a
tiny checkpoint budget, checkpoints taken from the scan or by split steps, caller boundaries.
Every invariant of the base machine holds (no leaks, every checkpoint holds the state its key
names, ``check_integrity`` — which asserts the budget, pending saves included), and every
eviction the book makes, under any request sequence: takes an unreferenced checkpoint (never
one a running request holds: the one it resumed from, a restore in flight), never a slot
another structure uses (live, trailing, pending, held), and the least valuable free one."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant

from hybridkv.kv.checkpoint_admission import supersedable
from hybridkv.kv.checkpoint_book import CheckpointBook
from hybridkv.kv.checkpoint_counters import EvictReason
from hybridkv.kv.state_manager import StateManager
from tests.kv.builders import FakeRequest, make_coordinator
from tests.kv.test_properties import KVMachine


class PressureMachine(KVMachine):
    @initialize(
        name=st.sampled_from(["granite", "qwen35", "state_only"]),
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(8, 48),
        num_slots=st.integers(3, 10),
        max_checkpoints=st.integers(0, 4),
        from_scan=st.booleans(),
        interval_blocks=st.sampled_from([0, 1, 2]),
        seed=st.integers(0, 2**16),
    )
    def setup(  # type: ignore[override]
        self,
        name: str,
        block_size: int,
        num_blocks: int,
        num_slots: int,
        max_checkpoints: int,
        from_scan: bool,
        interval_blocks: int,
        seed: int,
    ) -> None:
        self.B = block_size
        self.coord = make_coordinator(
            name,
            num_blocks,
            num_slots,
            block_size,
            8,
            interval_blocks * block_size,
            max_checkpoints=max_checkpoints,
            states_from_scan=from_scan,
        )
        self.bases = [[(seed + 7 * i + j) % 5 for j in range(12 * block_size)] for i in range(2)]
        self.waiting = []
        self.running = {}
        self.content = {}
        self.counter = 0
        self.history = []
        self.evictions = 0
        for sm in self.coord.state:
            self._watch(sm.book, sm)

    def _request(self, tokens: list[int], salt: str | None = None) -> FakeRequest:
        """Token 0 ends a "message": the same prefix always names the same boundaries."""
        ends = tuple(i + 1 for i, t in enumerate(tokens) if t == 0)
        return FakeRequest(self._new_id(), tokens, self.B, cache_salt=salt, cache_boundaries=ends)

    def _watch(self, book: CheckpointBook, sm: StateManager) -> None:
        forget = book._forget

        def checked(slot: int, reason: EvictReason) -> None:
            if reason is not EvictReason.LOST:
                self._check_victim(book, sm, slot, reason)
                self.evictions += 1
            forget(slot, reason)

        book._forget = checked  # type: ignore[method-assign]

    def _check_victim(
        self, book: CheckpointBook, sm: StateManager, slot: int, reason: EvictReason
    ) -> None:
        assert book.pool.ref_cnt[slot] == 0, f"evicted slot {slot}, referenced"
        assert slot not in sm.held_refs(), f"evicted slot {slot}, which a request uses"
        assert slot not in sm.held.values()
        if reason is EvictReason.SUPERSEDED:  # a finishing request's own: any worth
            assert supersedable(book, slot), f"superseded slot {slot} of the wrong kind"
            return
        free = [s for s in book.entries if book.pool.ref_cnt[s] == 0]
        worth = book.value(book.entries[slot])
        assert all(worth <= book.value(book.entries[s]) for s in free), (
            f"evicted {slot} worth {worth}, a free one is worth less"
        )

    @invariant()
    def within_budget(self) -> None:
        """Checkpoints plus pending saves never exceed the budget, whatever ran."""
        if not hasattr(self, "coord"):
            return
        for sm in self.coord.state:
            cap = sm.book.capacity
            assert cap is None or sm.book.count() + sm.num_pending() <= cap


DEEP = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class TestPressureMachine(PressureMachine.TestCase):
    """The fast tier's run: the same machine and invariants over fewer programs."""

    settings = settings(DEEP, max_examples=40)


@pytest.mark.slow
class TestPressureMachineDeep(PressureMachine.TestCase):
    """The full budget (150 programs of up to 50 steps), in ``make test``."""

    settings = DEEP

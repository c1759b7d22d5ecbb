"""The KV state machine (``test_properties``) on state layouts under checkpoint pressure: a
tiny checkpoint budget, checkpoints taken from the scan or by split steps, caller boundaries.
Every invariant of the base machine holds (no leaks, every checkpoint holds the state its key
names, ``check_integrity`` — which asserts the budget), and every eviction takes the least
valuable free checkpoint: not shared (two hits, or continued two ways) before shared, then
periodic before prompt before caller, then links (continued by another checkpoint, fewer
continuations first) before frontiers (judged from the requests' tokens, not the book's
bookkeeping)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize

from hybridkv.kv.checkpoint_book import CheckpointBook
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
        self.known: list[FakeRequest] = []  # every request made: whose tokens a hash names
        for sm in self.coord.state:
            self._watch(sm.book)

    def _request(self, tokens: list[int], salt: str | None = None) -> FakeRequest:
        """Token 0 ends a "message": the same prefix always names the same boundaries."""
        ends = tuple(i + 1 for i, t in enumerate(tokens) if t == 0)
        req = FakeRequest(self._new_id(), tokens, self.B, cache_salt=salt, cache_boundaries=ends)
        self.known.append(req)
        return req

    def _prefix_of(self, block_hash: object) -> tuple[str | None, tuple[int, ...]] | None:
        for req in self.known:
            for k, h in enumerate(req.block_hashes):
                if h == block_hash:
                    return req.cache_salt, tuple(req.token_ids[: (k + 1) * self.B])
        return None

    def _watch(self, book: CheckpointBook) -> None:
        evict_one = book.evict_one

        def checked(newcomer: frozenset[object] = frozenset()) -> bool:
            slot = book.victim(newcomer)  # type: ignore[arg-type]
            if slot is not None:
                self._check_victim(book, slot, newcomer)
                self.evictions += 1
            return evict_one(newcomer)  # type: ignore[arg-type]

        book.evict_one = checked  # type: ignore[method-assign]

    def _check_victim(self, book: CheckpointBook, slot: int, newcomer: frozenset[object]) -> None:
        """Judged from the requests' tokens: which checkpoints continue which (and in how
        many ways), not from the book's own prefix bookkeeping."""
        prefixes = {s: self._prefix_of(e.key[0]) for s, e in book.entries.items()}

        def continuing(s: int) -> list[tuple[int, ...]]:
            mine = prefixes[s]
            if mine is None:
                return []
            n = len(mine[1])
            return [
                o[1][n : n + self.B]
                for t, o in prefixes.items()
                if t != s and o is not None and o[0] == mine[0] and len(o[1]) > n
                if o[1][:n] == mine[1]
            ]

        def rank(s: int) -> tuple[bool, int, bool, int]:
            e, after = book.entries[s], continuing(s)
            n = len(after) + (e.key[0] in newcomer)
            return (e.hits >= 2 or len(set(after)) >= 2, int(e.kind), n == 0, -n)

        free = [s for s in book.entries if book.pool.ref_cnt[s] == 0]
        assert all(rank(slot) <= rank(s) for s in free), (
            f"evicted {slot} {rank(slot)}, a free one ranks lower: {min(rank(s) for s in free)}"
        )


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

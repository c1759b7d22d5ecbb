"""Property-based tests: random request lifecycles over random layouts keep every invariant.

The machine also models what each state slot *contains* (the prefix it was computed over),
applying the restores and saves the coordinator hands out, so a checkpoint keyed by a hash it
does not hold is caught, not just a bookkeeping mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hybridkv.kv.attention_managers import FullAttentionManager, SlidingWindowManager, cdiv
from hybridkv.kv.block_pool import NULL_BLOCK
from hybridkv.kv.coordinator import CacheHit, KVCacheCoordinator
from hybridkv.kv.state_manager import StateCopy
from tests.kv.builders import FakeRequest, make_coordinator

NAMES = [
    "full",
    "sliding",
    "gemma3",
    "granite",
    "qwen35",
    "two_windows",
    "state_only",
    "gptoss",
    "irregular",
]
Content = object  # a block hash (state exactly at that boundary) or an opaque marker


@dataclass
class Running:
    req: FakeRequest
    end: int | None = None  # end of the step in flight
    saves: list[StateCopy] = field(default_factory=list)


class KVMachine(RuleBasedStateMachine):
    coord: KVCacheCoordinator

    @initialize(
        name=st.sampled_from(NAMES + ["granite", "qwen35", "state_only"]),
        block_size=st.sampled_from([1, 2, 3, 4, 8]),
        window_blocks=st.integers(0, 4),
        window_extra=st.integers(1, 8),
        num_blocks=st.integers(2, 48),
        num_slots=st.integers(2, 8),
        interval_blocks=st.sampled_from([0, 1, 2, 4]),
        seed=st.integers(0, 2**16),
    )
    def setup(
        self,
        name: str,
        block_size: int,
        window_blocks: int,
        window_extra: int,
        num_blocks: int,
        num_slots: int,
        interval_blocks: int,
        seed: int,
    ) -> None:
        self.B = block_size
        window = window_blocks * block_size + window_extra
        self.coord = make_coordinator(
            name, num_blocks, num_slots, block_size, window, interval_blocks * block_size
        )
        self.bases = [[(seed + 7 * i + j) % 5 for j in range(12 * block_size)] for i in range(2)]
        self.waiting: list[FakeRequest] = []
        self.running: dict[str, Running] = {}
        self.content: dict[tuple[int, int], Content] = {}
        self.counter = 0
        self.history: list[FakeRequest] = []

    # -- helpers -------------------------------------------------------------------------

    def _new_id(self) -> str:
        self.counter += 1
        return f"r{self.counter}"

    def _request(self, tokens: list[int], salt: str | None = None) -> FakeRequest:
        return FakeRequest(self._new_id(), tokens, self.B, cache_salt=salt)

    def _at(self, req: FakeRequest, n: int) -> Content:
        """What a state computed over the first n tokens of ``req`` is (hash at a boundary)."""
        if n == 0:
            return ("empty",)
        if n % self.B == 0:
            return req.block_hashes[n // self.B - 1]
        return ("partial", tuple(req.token_ids[:n]), req.cache_salt)

    def _valid(self, req: FakeRequest, L: int) -> bool:
        c, h = self.coord, req.block_hashes
        for m in c.attn:
            if isinstance(m, FullAttentionManager):
                lo = 0
            else:
                assert isinstance(m, SlidingWindowManager)
                lo = max(0, L - cdiv(m.window - 1, self.B))
            if any((h[k], m.group_id) not in c.pool.cached for k in range(lo, L)):
                return False
        return all(L == 0 or (h[L - 1], sm.group_id) in sm.pool.cached for sm in c.state)

    def _check_hit(self, req: FakeRequest, hit: CacheHit) -> None:
        c, B, h = self.coord, self.B, req.block_hashes
        L, rem = divmod(hit.num_tokens, B)
        assert rem == 0 and hit.num_tokens <= req.num_tokens - 1
        max_blocks = min((req.num_tokens - 1) // B, len(h))
        best = max(k for k in range(max_blocks + 1) if self._valid(req, k))
        assert best == L, f"hit {L} blocks, the largest boundary valid in every group is {best}"
        for i, m in enumerate(c.attn):
            ids = hit.block_ids[i]
            assert len(ids) == L
            real = [k for k, b in enumerate(ids) if b != NULL_BLOCK]
            assert real == list(range(L - len(real), L)), "nulls only lead"
            if isinstance(m, FullAttentionManager):
                assert len(real) == L
            else:
                assert isinstance(m, SlidingWindowManager)
                assert len(real) >= min(L, cdiv(m.window - 1, B))
            for k in real:
                assert c.pool.key[ids[k]] == (h[k], m.group_id)
        for j, sm in enumerate(c.state):
            slot = hit.state_slots[j]
            if L == 0:
                assert slot is None
            else:
                assert slot is not None and sm.pool.key[slot] == (h[L - 1], sm.group_id)
                assert self.content.get((sm.group_id, slot)) == h[L - 1]

    def _allocate(
        self, req: FakeRequest, start: int, end: int, lookahead: int, hit: CacheHit | None
    ) -> bool:
        c = self.coord
        is_new = not c.has_request(req.request_id)
        free_before = c.pool.num_free
        if not c.allocate(req, end - start, hit, num_lookahead_tokens=lookahead):
            if is_new:
                assert not c.has_request(req.request_id)
                assert c.pool.num_free == free_before
            return False
        restores, saves = c.take_state_copies()
        if is_new:
            assert hit is not None
            for i, m in enumerate(c.attn):
                assert tuple(m.tables[req.request_id][: len(hit.block_ids[i])]) == hit.block_ids[i]
            expected = [
                StateCopy(sm.group_id, s, sm.live[req.request_id])
                for sm, s in zip(c.state, hit.state_slots, strict=True)
                if s is not None
            ]
            assert restores == expected
        else:
            assert restores == []
        for sm in c.state:
            live = sm.live[req.request_id]
            src = next((r.src_slot for r in restores if r.group_id == sm.group_id), None)
            if is_new:
                self.content[(sm.group_id, live)] = (
                    ("empty",) if src is None else self.content[(sm.group_id, src)]
                )
        for s in saves:
            assert (
                s.src_slot
                == c.state[c.layout.state_group_ids.index(s.group_id)].live[req.request_id]
            )
        self.running[req.request_id] = Running(req, end, saves)
        req.num_computed_tokens = start
        return True

    def _compute(self, r: Running) -> None:
        assert r.end is not None
        req, c = r.req, self.coord
        req.num_computed_tokens = r.end
        for sm in c.state:
            self.content[(sm.group_id, sm.live[req.request_id])] = self._at(req, r.end)
        for s in r.saves:  # at the step's end, or from inside it (the scan's state at `at`)
            self.content[(s.group_id, s.dst_slot)] = self._at(req, r.end if s.at is None else s.at)
        r.end, r.saves = None, []
        c.cache(req, req.num_computed_tokens)
        c.end_step()

    def _tokens(self, data: st.DataObject, max_len: int) -> list[int]:
        """A shared base or an earlier request (a next turn), cut, plus a short random tail."""
        bases = self.bases + [r.token_ids for r in self.history[-4:]]
        base = bases[data.draw(st.integers(0, len(bases) - 1))]
        cut = min(len(base), max_len)
        keep = data.draw(st.one_of(st.just(cut), st.integers(0, cut)))
        tail = data.draw(
            st.lists(st.integers(0, 3), min_size=0 if keep else 1, max_size=max(1, max_len - keep))
        )
        return base[:keep] + tail

    # -- rules ---------------------------------------------------------------------------

    @precondition(lambda self: len(self.waiting) + len(self.running) < 6)
    @rule(data=st.data())
    def add(self, data: st.DataObject) -> None:
        tokens = self._tokens(data, 8 * self.B)
        salt = data.draw(st.sampled_from([None, None, None, "s"]))
        self.waiting.append(self._request(tokens, salt))
        self.history.append(self.waiting[-1])

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        req = self.waiting[data.draw(st.integers(0, len(self.waiting) - 1))]
        hit = self.coord.find_cache_hit(req)
        self._check_hit(req, hit)
        start = hit.num_tokens
        budget = data.draw(st.integers(1, req.num_tokens))
        end = self.coord.next_step_end(req, start, min(req.num_tokens, start + budget), hit)
        assert start < end <= req.num_tokens
        if self._allocate(req, start, end, data.draw(st.integers(0, self.B)), hit):
            self.waiting.remove(req)

    @precondition(lambda self: any(r.end is None for r in self.running.values()))
    @rule(data=st.data())
    def schedule(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from([r for r in self.running.values() if r.end is None]))
        req = r.req
        start = req.num_computed_tokens
        if start == req.num_tokens:  # decode: the sampled token's KV is computed next
            req.append(data.draw(st.integers(0, 3)))
        budget = data.draw(st.integers(1, req.num_tokens - start))
        end = self.coord.next_step_end(req, start, start + budget)
        assert start < end <= req.num_tokens
        self._allocate(req, start, end, data.draw(st.integers(0, self.B)), None)

    @precondition(lambda self: any(r.end is not None for r in self.running.values()))
    @rule(data=st.data())
    def compute(self, data: st.DataObject) -> None:
        self._compute(
            data.draw(st.sampled_from([r for r in self.running.values() if r.end is not None]))
        )

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        r = self.running.pop(data.draw(st.sampled_from(sorted(self.running))))
        self.coord.free(r.req)
        assert not self.coord.has_request(r.req.request_id)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        r = self.running.pop(data.draw(st.sampled_from(sorted(self.running))))
        self.coord.free(r.req)
        r.req.num_computed_tokens = 0
        self.waiting.insert(0, r.req)

    @rule(data=st.data())
    def serve(self, data: st.DataObject) -> None:
        """A whole request at once: admit, prefill in chunks, decode a little, maybe finish."""
        tokens = self._tokens(data, 8 * self.B)
        req = self._request(tokens)
        self.history.append(req)
        hit = self.coord.find_cache_hit(req)
        self._check_hit(req, hit)
        budget = data.draw(st.integers(1, 4 * self.B))
        end = self.coord.next_step_end(
            req, hit.num_tokens, min(req.num_tokens, hit.num_tokens + budget), hit
        )
        if not self._allocate(req, hit.num_tokens, end, 0, hit):
            return
        num_decode = data.draw(st.integers(0, 2 * self.B))
        while True:
            r = self.running[req.request_id]
            self._compute(r)
            start = req.num_computed_tokens
            if start == req.num_tokens:
                if num_decode == 0:
                    break
                num_decode -= 1
                req.append(data.draw(st.integers(0, 3)))
            end = self.coord.next_step_end(req, start, min(req.num_tokens, start + budget))
            if not self._allocate(req, start, end, 0, None):
                break
        if data.draw(st.booleans()) or self.running[req.request_id].end is not None:
            del self.running[req.request_id]
            self.coord.free(req)

    @rule(data=st.data())
    def pressure(self, data: st.DataObject) -> None:
        """A one-step request of fresh tokens: evicts cached blocks in LRU order."""
        n = data.draw(st.integers(1, 6 * self.B))
        self.counter += 1
        tokens = [10_000 + 100 * self.counter + i for i in range(n)]
        req = self._request(tokens)
        hit = self.coord.find_cache_hit(req)
        self._check_hit(req, hit)  # 0, unless a window of 1 token needs no earlier KV at all
        if self._allocate(req, hit.num_tokens, n, 0, hit):
            self._compute(self.running[req.request_id])
            del self.running[req.request_id]
            self.coord.free(req)

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        pools = [self.coord.pool] + [sm.pool for sm in self.coord.state]
        pool = data.draw(st.sampled_from(pools))
        keyed = [i for i, k in enumerate(pool.key) if k is not None]
        if keyed:
            pool.evict(data.draw(st.sampled_from(keyed)))

    @rule()
    def reset(self) -> None:
        c = self.coord
        self.coord.end_step()
        idle = c.pool.num_free == c.pool.capacity and all(
            sm.pool.num_free == sm.pool.capacity for sm in c.state
        )
        assert c.reset_prefix_cache() == idle
        if idle:
            assert not c.pool.cached and all(not sm.pool.cached for sm in c.state)

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def integrity(self) -> None:
        if not hasattr(self, "coord"):
            return
        c = self.coord
        c.check_integrity()
        for rid, r in self.running.items():
            for m in c.attn:
                for k, b in enumerate(m.tables[rid]):
                    key = c.pool.key[b] if b != NULL_BLOCK else None
                    if key is not None:  # hashed only once computed, and with this prefix
                        assert (k + 1) * self.B <= r.req.num_computed_tokens, (rid, k, b)
                        assert key == (r.req.block_hashes[k], m.group_id)
        for sm in c.state:
            for s, key in enumerate(sm.pool.key):
                if key is not None:
                    assert self.content.get((sm.group_id, s)) == key[0], (
                        f"slot {s} holds other state"
                    )

    def teardown(self) -> None:
        if not hasattr(self, "coord"):
            return
        for r in list(self.running.values()):
            self.coord.free(r.req)
        self.coord.end_step()
        self.coord.check_integrity()
        assert self.coord.is_idle()


DEEP = settings(
    max_examples=400,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class TestKVMachine(KVMachine.TestCase):
    """The fast tier's run: the same machine and invariants over fewer programs."""

    settings = settings(DEEP, max_examples=60)


@pytest.mark.slow
class TestKVMachineDeep(KVMachine.TestCase):
    """The full budget (400 programs of up to 60 steps), in ``make test``."""

    settings = DEEP

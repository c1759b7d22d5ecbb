"""Checkpoints where reuse happens (caller boundaries), taken from the scan (no split steps),
in a bounded pool that evicts by value. Granite layout, block size 4."""

from __future__ import annotations

import pytest

from hybridkv.kv.checkpoints import CheckpointKind, CheckpointPolicy
from hybridkv.kv.coordinator import KVCacheCoordinator
from hybridkv.kv.state_manager import StateCopy
from tests.kv.builders import FakeRequest, make_coordinator, prefill


def _scan(**kw: object) -> KVCacheCoordinator:
    return make_coordinator("granite", num_blocks=64, states_from_scan=True, **kw)  # type: ignore[arg-type]


def _serve(coord: KVCacheCoordinator, req: FakeRequest) -> list[StateCopy]:
    """Admit and prefill in one step; returns the step's saves; frees the request."""
    hit = coord.find_cache_hit(req)
    assert coord.allocate(req, req.num_tokens - hit.num_tokens, hit)
    _, saves = coord.take_state_copies()
    req.num_computed_tokens = req.num_tokens
    coord.cache(req, req.num_tokens)
    coord.end_step()
    coord.free(req)
    coord.check_integrity()
    return saves


def test_policy_rounds_caller_boundaries_and_ignores_outside() -> None:
    p = CheckpointPolicy(4, 0)
    b = p.request_boundaries(30, 0, (29, 0, 3, 100, 13, 13, 31))
    assert b.due == (12, 28) and b.caller == frozenset({12, 28})  # 29 -> 28 (also P-1 end)
    assert p.kind(12, b) is CheckpointKind.CALLER
    assert p.due_inside(0, 30, b) == [12, 28]
    assert CheckpointPolicy(4, 8).due_inside(4, 30, b) == [8, 12, 16, 24, 28]


def test_first_sharer_hits_a_caller_boundary_taken_inside_one_step() -> None:
    coord = _scan()
    a = FakeRequest("A", list(range(40)), cache_boundaries=(16,))
    saves = _serve(coord, a)
    live = saves[0].src_slot
    # 16 from inside the step; 36 (= floor(39/4)*4, prompt end) too; 40 at the end
    assert [(s.src_slot, s.at) for s in saves] == [(live, 16), (live, 36), (live, None)]
    b = FakeRequest("B", list(range(16)) + [99] * 10)
    assert coord.find_cache_hit(b).num_tokens == 16
    assert coord.next_step_end(b, 0, 26) == 26  # never clipped


def test_split_mode_still_clips_at_caller_boundaries() -> None:
    coord = make_coordinator("granite", num_blocks=64)
    a = FakeRequest("A", list(range(40)), cache_boundaries=(16,))
    assert prefill(coord, a) == [16, 36, 40]


def test_budget_holds_and_periodic_checkpoints_go_first() -> None:
    coord = _scan(num_state_slots=16, max_checkpoints=3, interval=8)
    book = coord.state[0].book
    book.record_evictions = True
    a = FakeRequest("A", list(range(30)), cache_boundaries=(12,))
    _serve(coord, a)  # due: 8, 12 (caller), 16, 24, 28 (prompt end): only 3 fit at once
    assert book.count() <= 3
    kinds = {e.boundary: e.kind for e in book.entries.values()}
    assert CheckpointKind.CALLER in kinds.values()
    assert all(e.kind is CheckpointKind.PERIODIC for e in book.evictions)


def test_no_room_means_no_checkpoint_not_a_failure() -> None:
    coord = _scan(num_state_slots=4, max_checkpoints=0)
    a = FakeRequest("A", list(range(20)), cache_boundaries=(8,))
    assert [s.at for s in _serve(coord, a)] == []
    assert coord.state[0].book.count() == 0
    assert coord.is_idle()


@pytest.mark.parametrize("bad", [-1, 0.5, True, "8", None])
def test_sampling_params_refuse_bad_boundaries(bad: object) -> None:
    from hybridkv.sampling.params import SamplingParams

    with pytest.raises(ValueError, match="cache_boundaries"):
        SamplingParams(extra_args={"cache_boundaries": [bad]})
    assert SamplingParams(extra_args={"cache_boundaries": [9, 3]}).cache_boundaries == (9, 3)


def test_a_link_goes_before_the_frontier_that_continues_it() -> None:
    coord = _scan(num_state_slots=16, max_checkpoints=2, interval=4)
    book = coord.state[0].book
    book.record_evictions = True
    _serve(coord, FakeRequest("A", list(range(30))))
    assert sorted(e.boundary for e in book.entries.values()) == [4, 8]  # then full (pending)
    _serve(coord, FakeRequest("B", [90 + i for i in range(6)], cache_boundaries=(4,)))
    assert [e.boundary for e in book.evictions] == [4]  # A's 8 continues A's 4: 4 is a link
    assert sorted(e.boundary for e in book.entries.values()) == [4, 8]  # B's 4, A's 8

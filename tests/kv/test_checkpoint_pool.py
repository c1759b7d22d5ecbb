"""Checkpoints where reuse happens (caller boundaries), taken from the scan (no split steps),
in a bounded pool that evicts by value. Granite layout, block size 4."""

from __future__ import annotations

import pytest

from hybridkv.kv.checkpoints import CheckpointKind, CheckpointPolicy
from hybridkv.kv.coordinator import KVCacheCoordinator
from hybridkv.kv.state_manager import StateCopy
from tests.kv.builders import FakeRequest, decode, make_coordinator, prefill


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


def test_tail_goes_before_head_and_hit_before_never_hit() -> None:
    coord = _scan(num_state_slots=16, max_checkpoints=2)
    book = coord.state[0].book
    book.record_evictions = True
    a = FakeRequest("A", list(range(20)), cache_boundaries=(8,))
    _serve(coord, a)  # 8 (caller) and 16 (prompt end); 20 (prompt end) does not displace them
    assert sorted(e.boundary for e in book.entries.values()) == [8, 16]
    b = FakeRequest("B", [50 + i for i in range(12)], cache_boundaries=(4,))
    _serve(coord, b)  # B's 4 (caller) displaces A's tail (16), not its head (8); B's prompt
    assert [e.boundary for e in book.evictions] == [16]  # ends (8) are worth less than A's 8
    assert sorted(e.boundary for e in book.entries.values()) == [4, 8]
    hit = FakeRequest("C", list(range(8)) + [7, 7, 7])
    assert coord.find_cache_hit(hit).num_tokens == 8
    _serve(coord, hit)  # the checkpoint at A's 8 has served a hit now
    book.evictions.clear()
    _serve(coord, FakeRequest("D", [300 + i for i in range(6)], cache_boundaries=(4,)))
    assert book.evictions == []  # an equal newcomer does not displace B's 4, nor the hit 8
    assert any(e.boundary == 8 and e.hits == 1 for e in book.entries.values())


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


def test_a_new_turn_end_displaces_the_turn_end_it_continues() -> None:
    """A full pool of frontiers refuses an equal newcomer, except the next turn of one of
    them: the newcomer makes the one it continues a link."""
    coord = _scan(num_state_slots=16, max_checkpoints=2)
    book = coord.state[0].book
    a, b = list(range(1, 11)), list(range(50, 60))  # 10 tokens: one prompt end, at 8
    _serve(coord, FakeRequest("A", a))
    _serve(coord, FakeRequest("B", b))
    _serve(coord, FakeRequest("C", list(range(80, 90))))  # an equal frontier: refused
    assert coord.find_cache_hit(FakeRequest("C2", list(range(80, 90)))).num_tokens == 0
    # A's next turn hits A's 8 (pinned while it restores, so its prompt end at 12 is not
    # saved), decodes past 16 and ends: its last state displaces A's 8, which it continues
    a2 = FakeRequest("A2", [*a, 9, 9, 9, 9])
    assert prefill(coord, a2) == [14]
    assert decode(coord, a2, 5) and decode(coord, a2, 5)
    coord.free(a2)
    coord.check_integrity()
    assert sorted(e.boundary for e in book.entries.values()) == [8, 16]
    assert coord.find_cache_hit(FakeRequest("A3", [*a2.token_ids, 1])).num_tokens == 16
    assert coord.find_cache_hit(FakeRequest("B2", [*b, 1])).num_tokens == 8


def test_a_branch_point_outlives_the_links_of_one_conversation() -> None:
    """A boundary two conversations continue (a shared system prompt) is shared: it stays
    while the single-lineage checkpoints around it go."""
    coord = _scan(num_state_slots=16, max_checkpoints=3)
    book = coord.state[0].book
    system = [7, 7, 7, 1]
    _serve(coord, FakeRequest("A", system + [1, 2, 3, 4, 5, 6, 7, 8], cache_boundaries=(4,)))
    _serve(coord, FakeRequest("B", system + [9, 8, 7, 6, 5, 4, 3, 2], cache_boundaries=(4,)))
    at4 = [e for e in book.entries.values() if e.boundary == 4]
    assert len(at4) == 1 and book.is_shared(at4[0]) and at4[0].hits == 1
    for i in range(3):  # more conversations on other system prompts push the pool
        _serve(coord, FakeRequest(f"C{i}", [200 + 20 * i + j for j in range(12)]))
    assert any(e.boundary == 4 and e.key == at4[0].key for e in book.entries.values())

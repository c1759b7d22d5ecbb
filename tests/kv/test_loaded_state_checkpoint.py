"""A load that wrote a request's live state at a due block boundary leaves a checkpoint there:
its first computing step copies the loaded state out before the forward (with the restores),
so a request sharing the prefix (the other copies of an ``n > 1`` request) hits it. Exact slot
copies, no leaks."""

from __future__ import annotations

from hybridkv.kv.coordinator import KVCacheCoordinator
from tests.kv.builders import FakeRequest, make_coordinator

B = 4


def _load_then_compute(coord: KVCacheCoordinator, req: FakeRequest, external: int) -> tuple:
    """Admit ``req`` with ``external`` tokens loading (no compute), then its first step."""
    assert coord.allocate(req, 0, coord.find_cache_hit(req), num_external_tokens=external)
    assert coord.take_state_copies() == ([], [])  # the load step copies nothing
    coord.end_step()
    req.num_computed_tokens = external  # the load landed and verified
    coord.cache(req, external)
    rest = req.num_tokens - external
    assert coord.allocate(req, rest)
    copies = coord.take_state_copies()
    req.num_computed_tokens += rest
    coord.cache(req, req.num_computed_tokens)
    coord.end_step()
    return copies


def test_the_loaded_state_becomes_a_checkpoint_and_hits() -> None:
    coord = make_coordinator("granite", num_blocks=32, num_state_slots=8)
    a = FakeRequest("A", list(range(10)))  # prompt end boundary: 8
    restores, saves = _load_then_compute(coord, a, external=8)
    live = coord.state[0].live["A"]
    # before the forward: live slot -> a new checkpoint slot (the loaded state at 8)
    assert [(c.src_slot, c.at) for c in restores] == [(live, None)]
    assert restores[0].dst_slot != live and saves == []
    b = FakeRequest("B", list(range(10)))  # another copy of the same prompt
    hit = coord.find_cache_hit(b)
    assert hit.num_tokens == 8 and hit.state_slots == (restores[0].dst_slot,)
    coord.free(a)
    coord.end_step()
    coord.check_integrity()


def test_nothing_is_saved_when_the_step_does_not_start_at_the_load() -> None:
    """A failed load rewinds the request (recovery): its next step starts lower, where the
    live state is not the loaded one; an unaligned load end is no boundary either."""
    coord = make_coordinator("granite", num_blocks=32, num_state_slots=8)
    a = FakeRequest("A", list(range(10)))
    assert coord.allocate(a, 0, coord.find_cache_hit(a), num_external_tokens=8)
    coord.take_state_copies()
    coord.end_step()
    a.num_computed_tokens = 0  # recovery: start over
    assert coord.allocate(a, 10)
    restores, _ = coord.take_state_copies()
    assert restores == []
    coord.free(a)
    c = FakeRequest("C", list(range(20, 31)))
    restores, _ = _load_then_compute(coord, c, external=9)  # not a block boundary
    assert restores == []
    coord.free(c)
    coord.end_step()
    coord.check_integrity()
    assert coord.is_idle()

"""The coordinator's per-key cache events replay to exactly its prefix maps."""

from __future__ import annotations

import random

import pytest

from hybridkv.kv.block_pool import CacheKey, EventKind
from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator
from hybridkv.kv.events import CacheEvent
from tests.kv.builders import B, FakeRequest, make_layout, run_step


def make(name: str, slots: int = 6) -> KVCacheCoordinator:
    """A pool that holds one request of the workload below and a little more: it evicts."""
    layout = make_layout(name)
    num_blocks = 8 * len(layout.attention_group_ids) + 2
    config = KVCacheConfig(num_blocks, slots, True, 2 * B, key_events=True)
    return KVCacheCoordinator(layout, config)


def device_keys(coord: KVCacheCoordinator) -> set[CacheKey]:
    keys = set(coord.pool.cached)
    for sm in coord.state:
        keys |= set(sm.pool.cached)
    return keys


def replay(events: list[CacheEvent], into: set[CacheKey]) -> None:
    for ev in events:
        if ev.kind is EventKind.CLEARED:
            into.clear()
        elif ev.kind is EventKind.STORED:
            assert ev.key is not None and ev.key not in into, "stored twice"
            assert ev.request is not None and ev.key[0] in ev.request.block_hashes
            into.add(ev.key)
        else:
            assert ev.key in into, "removed a key never stored"
            into.discard(ev.key)


@pytest.mark.parametrize("name", ["full", "gemma3", "granite", "qwen35"])
def test_events_replay_to_the_prefix_maps_under_eviction(name: str) -> None:
    coord = make(name)
    rng = random.Random(7)
    prefixes = [[rng.randrange(50) for _ in range(4 * B)] for _ in range(3)]
    seen: set[CacheKey] = set()
    num_removed = 0
    for i in range(12):
        tokens = prefixes[i % 3][: rng.randrange(B, 4 * B)] + [100 + i] * rng.randrange(1, 2 * B)
        req = FakeRequest(f"r{i}", tokens)
        while req.num_computed_tokens < req.num_tokens:
            n = min(B + 1, req.num_tokens - req.num_computed_tokens)
            assert run_step(coord, req, n)
        coord.free(req)
        events = coord.take_events()
        num_removed += sum(ev.kind is EventKind.REMOVED for ev in events)
        replay(events, seen)
        assert seen == device_keys(coord)
    assert num_removed > 0, "the workload should evict"
    coord.check_integrity()


def test_reset_is_one_cleared_event() -> None:
    coord = make("granite")
    req = FakeRequest("a", list(range(3 * B + 1)))
    assert run_step(coord, req, req.num_tokens)
    coord.free(req)
    assert coord.take_events()
    assert coord.reset_prefix_cache()
    assert [ev.kind for ev in coord.take_events()] == [EventKind.CLEARED]
    assert device_keys(coord) == set() and coord.events is not None
    assert coord.events.cached_keys() == set()


def test_without_key_events_the_pools_keep_their_own_events() -> None:
    coord = KVCacheCoordinator(make_layout("full"), KVCacheConfig(16, 0))
    req = FakeRequest("a", list(range(2 * B + 1)))
    assert run_step(coord, req, req.num_tokens)
    assert coord.take_events() == []
    assert [ev.kind for ev in coord.pool.take_events()] == [EventKind.STORED] * 2

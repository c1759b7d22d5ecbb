"""Scenarios over the coordinator; each ends with check_integrity() and no leaks."""

from __future__ import annotations

from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator
from hybridkv.kv.spec import create_layout
from tests.kv.builders import (
    FakeRequest,
    decode,
    full,
    make_coordinator,
    mamba,
    prefill,
    queue,
    swa,
)


def finish(coord: KVCacheCoordinator, *reqs: FakeRequest) -> None:
    for r in reqs:
        coord.free(r)
    coord.end_step()
    coord.check_integrity()
    assert coord.is_idle()


def test_shared_prefix_hits_the_largest_boundary_valid_in_every_group() -> None:
    # groups: 0 full, 1 sliding W=8 (2 blocks), 2 state; checkpoints every 8 tokens
    layout = create_layout([full(), swa(8), mamba()])
    coord = KVCacheCoordinator(layout, KVCacheConfig(40, 8, True, 8))
    a = FakeRequest("A", list(range(26)))
    assert prefill(coord, a) == [8, 16, 24, 26]
    coord.free(a)
    sm = coord.state[0]
    # drop the checkpoint at 24 tokens and the sliding block 3 (tokens 12..15)
    at24 = sm.pool.get_cached((a.block_hashes[5], 2))
    at8 = sm.pool.get_cached((a.block_hashes[1], 2))
    sw3 = coord.pool.get_cached((a.block_hashes[3], 1))
    assert at24 is not None and at8 is not None and sw3 is not None
    sm.pool.evict(at24)
    coord.pool.evict(sw3)

    b = FakeRequest("B", list(range(24)) + [90, 91, 92, 93])
    hit = coord.find_cache_hit(b)
    # full: 6 blocks; sliding alone: 6; state alone: 4 (16 tokens). At 4 the window needs
    # blocks 2,3 (3 is gone), so sliding says 3; state has nothing at 3 -> 2; both agree on 2.
    assert hit.group_hit_tokens == (24, 24, 16)
    assert hit.num_tokens == 8
    assert hit.state_slots == (at8,)
    assert hit.num_common_prefix_tokens == 24
    assert len(hit.block_ids[0]) == len(hit.block_ids[1]) == 2
    assert hit.block_ids[1][0] != 0  # the run from block 0 is the window
    # the junction at 24 is due, as are 8 and 16 (interval) and B's prompt boundary 24
    assert prefill(coord, b) == [16, 24, 28]
    c = FakeRequest("C", list(range(24)) + [70, 71, 72, 73, 74])
    assert coord.find_cache_hit(c).num_tokens == 24
    finish(coord, b)


def test_granite_64_token_prefix_with_periodic_checkpoint_hits_64() -> None:
    # vLLM inflates a Mamba hybrid's block size to hundreds of tokens, so this prefix would
    # hit 0 there; with B = 16 and separate state slots it hits all 64 tokens.
    coord = make_coordinator(
        "granite", num_blocks=64, num_state_slots=8, block_size=16, interval=64
    )
    prefix = list(range(1000, 1064))
    a = FakeRequest("A", prefix + list(range(20)), block_size=16)
    assert prefill(coord, a) == [64, 80, 84]
    b = FakeRequest("B", prefix + list(range(100, 130)), block_size=16)
    hit = coord.find_cache_hit(b)
    assert hit.num_tokens == 64 and hit.group_hit_tokens == (64, 64)
    assert hit.state_slots[0] is not None
    prefill(coord, b)
    finish(coord, a, b)


def test_granite_64_token_prefix_checkpointed_at_the_junction() -> None:
    coord = make_coordinator("granite", num_blocks=64, num_state_slots=8, block_size=16, interval=0)
    prefix = list(range(1000, 1064))
    a = FakeRequest("A", prefix + list(range(20)), block_size=16)
    assert prefill(coord, a) == [80, 84]  # only A's own prompt boundary is due
    coord.free(a)
    b = FakeRequest("B", prefix + list(range(100, 130)), block_size=16)
    hit = coord.find_cache_hit(b)
    assert (hit.num_tokens, hit.group_hit_tokens, hit.num_common_prefix_tokens) == (0, (64, 0), 64)
    assert prefill(coord, b) == [64, 80, 94]  # the junction 64 is due: B saves a checkpoint
    c = FakeRequest("C", prefix + list(range(200, 210)), block_size=16)
    hit = coord.find_cache_hit(c)
    assert (hit.num_tokens, hit.group_hit_tokens) == (64, (64, 64))
    prefill(coord, c)
    finish(coord, b, c)


def test_sliding_window_blocks_become_null_as_the_request_advances() -> None:
    coord = make_coordinator("sliding", num_blocks=20, window=8)  # skipped = (n - 7) // 4
    r = FakeRequest("R", list(range(12)))
    prefill(coord, r)
    assert coord.get_block_ids("R") == ([1, 2, 3],)
    expected = {
        12: [0, 2, 3, 4],
        13: [0, 2, 3, 4],
        14: [0, 2, 3, 4],
        15: [0, 0, 3, 4],
        16: [0, 0, 3, 4, 5],
        17: [0, 0, 3, 4, 5],
        18: [0, 0, 3, 4, 5],
        19: [0, 0, 0, 4, 5],
        20: [0, 0, 0, 4, 5, 6],
        23: [0, 0, 0, 0, 5, 6],
    }
    for n in range(12, 24):
        assert r.num_computed_tokens == n
        assert decode(coord, r, 500 + n)
        if n in expected:
            assert coord.get_block_ids("R") == (expected[n],), n
        coord.check_integrity()
    # blocks that left the window stay cached, evictable, at the back of the queue
    assert queue(coord.pool)[-4:] == [1, 2, 3, 4]
    assert all(coord.pool.key[b] is not None for b in (1, 2, 3, 4))
    # a new request with R's first 24 tokens hits through the window blocks 4 and 5
    s = FakeRequest("S", list(r.token_ids[:24]) + [1, 2, 3])
    hit = coord.find_cache_hit(s)
    assert (hit.num_tokens, hit.block_ids) == (24, ((0, 0, 0, 0, 5, 6),))
    prefill(coord, s)
    finish(coord, r, s)


def test_lru_eviction_takes_a_requests_tail_first() -> None:
    coord = make_coordinator("full", num_blocks=9)
    a = FakeRequest("A", list(range(13)))
    b = FakeRequest("B", list(range(100, 113)))
    prefill(coord, a)
    prefill(coord, b)
    assert coord.get_block_ids("A") == ([1, 2, 3, 4],)
    assert coord.get_block_ids("B") == ([5, 6, 7, 8],)
    coord.free(a)
    coord.free(b)
    assert queue(coord.pool) == [8, 4, 3, 2, 1, 7, 6, 5]

    def hit(tokens: list[int]) -> int:
        return coord.find_cache_hit(FakeRequest("probe", tokens)).num_tokens

    # a hit refreshes: A is used again, so its blocks move behind B's
    a2 = FakeRequest("A2", list(range(13)))
    prefill(coord, a2)
    coord.free(a2)
    assert queue(coord.pool) == [8, 4, 7, 6, 5, 3, 2, 1]
    c = FakeRequest("C", list(range(200, 212)))
    prefill(coord, c)  # pops 8, 4 (unkeyed) and B's tail block 7, handed out ascending
    assert coord.get_block_ids("C") == ([4, 7, 8],)
    assert hit(list(range(100, 113))) == 8  # B lost its tail only
    assert hit(list(range(13))) == 12
    d = FakeRequest("D", list(range(300, 308)))
    prefill(coord, d)
    assert coord.get_block_ids("D") == ([5, 6],)  # popped 6, 5 (B's tail first)
    assert hit(list(range(100, 113))) == 0
    assert hit(list(range(13))) == 12
    e = FakeRequest("E", list(range(400, 404)))
    prefill(coord, e)
    assert coord.get_block_ids("E") == ([3],)
    assert hit(list(range(13))) == 8  # A's tail goes first
    finish(coord, c, d, e)


def test_recycled_blocks_come_back_as_ascending_runs() -> None:
    """A request's blocks are freed tails first, so they wait in the queue descending; the
    request that takes them next gets them ascending: one run of pages, which a transfer
    moves as one descriptor per layer (popped in pop order, it would be one per block)."""
    coord = make_coordinator("full", num_blocks=9)
    a = FakeRequest("A", list(range(16)))
    b = FakeRequest("B", list(range(100, 116)))
    prefill(coord, a)
    prefill(coord, b)
    assert coord.get_block_ids("A") == ([1, 2, 3, 4],)
    coord.free(a)
    coord.free(b)
    assert queue(coord.pool) == [4, 3, 2, 1, 8, 7, 6, 5]  # eviction order: tails first
    c = FakeRequest("C", list(range(200, 216)))
    prefill(coord, c)
    assert coord.get_block_ids("C") == ([1, 2, 3, 4],)
    assert coord.find_cache_hit(FakeRequest("A2", list(range(16)))).num_tokens == 0
    assert coord.find_cache_hit(FakeRequest("B2", list(range(100, 116)))).num_tokens == 12
    finish(coord, c)


def test_full_prompt_hit_is_capped_at_n_minus_1() -> None:
    coord = make_coordinator("full", num_blocks=16)
    a = FakeRequest("A", list(range(12)))
    prefill(coord, a)
    coord.free(a)
    same = FakeRequest("A2", list(range(12)))
    hit = coord.find_cache_hit(same)
    assert (hit.num_tokens, hit.block_ids) == (8, ((1, 2),))  # the last block is recomputed
    assert coord.find_cache_hit(FakeRequest("A3", list(range(13)))).num_tokens == 12
    prefill(coord, same)
    assert same.num_computed_tokens == 12
    finish(coord, same)


def test_full_prompt_hit_on_state_layouts() -> None:
    for name in ("granite", "state_only"):
        coord = make_coordinator(name, num_blocks=16, num_state_slots=6, interval=0)
        a = FakeRequest("A", list(range(12)))  # due: floor(11/4)*4 = 8 and 12
        assert prefill(coord, a) == [8, 12]
        coord.free(a)
        again = FakeRequest("A2", list(range(12)))
        hit = coord.find_cache_hit(again)
        assert hit.num_tokens == 8 and hit.state_slots[0] is not None, name
        longer = FakeRequest("A3", list(range(12)) + [7])
        assert coord.find_cache_hit(longer).num_tokens == 12, name
        prefill(coord, again)
        prefill(coord, longer)
        finish(coord, again, longer)


def test_cache_salt_separates_tenants_and_disabled_caching_never_hits() -> None:
    coord = make_coordinator("gptoss", num_blocks=32)
    a = FakeRequest("A", list(range(13)), cache_salt="t1")
    prefill(coord, a)
    assert coord.find_cache_hit(FakeRequest("B", list(range(13)), cache_salt="t2")).num_tokens == 0
    assert coord.find_cache_hit(FakeRequest("C", list(range(13)), cache_salt="t1")).num_tokens == 12
    finish(coord, a)
    off = make_coordinator("gptoss", num_blocks=32, caching=False)
    a = FakeRequest("A", list(range(13)))
    prefill(coord=off, req=a)
    assert not off.pool.cached
    assert off.find_cache_hit(FakeRequest("B", list(range(13)))).num_tokens == 0
    finish(off, a)


def test_lookahead_and_reset_prefix_cache() -> None:
    coord = make_coordinator("gemma3", num_blocks=64)
    a = FakeRequest("A", list(range(10)))
    assert coord.allocate(a, 10, coord.find_cache_hit(a), num_lookahead_tokens=3)
    assert [len(t) for t in coord.get_block_ids("A")] == [4] * 6  # cdiv(13, 4)
    a.num_computed_tokens = 10
    coord.cache(a, 10)
    assert not coord.reset_prefix_cache()  # A still holds blocks
    assert coord.pool.cached
    coord.free(a)
    assert coord.reset_prefix_cache()
    assert not coord.pool.cached and all(k is None for k in coord.pool.key)
    finish(coord)


def test_external_tokens_get_unhashed_blocks_until_loaded() -> None:
    # groups: 0 full, 1 sliding W=8; A caches 2 blocks, B adopts them + 8 external tokens
    coord = make_coordinator("gptoss", num_blocks=32)
    a = FakeRequest("A", list(range(9)))
    prefill(coord, a)
    assert coord.get_block_ids("A") == ([1, 2, 3], [4, 5, 6])
    coord.free(a)
    assert queue(coord.pool) == [6, 3, *range(7, 32), 2, 1, 5, 4]
    b = FakeRequest("B", list(range(8)) + list(range(50, 62)))  # 20 tokens
    hit = coord.find_cache_hit(b)
    assert (hit.num_tokens, hit.block_ids) == (8, ((1, 2), (4, 5)))
    # 8 local + 8 external (loading) + 4 new: the window at 16 skips (16-7)//4 = 2 blocks,
    # so the sliding group needs no blocks for the hit at all and nulls them
    assert coord.allocate(b, 4, hit, num_external_tokens=8)
    assert coord.get_block_ids("B") == ([1, 2, 3, 6, 7], [0, 0, 8, 9, 10])  # popped 6, 3, 7
    assert coord.get_unhashed_block_ids("B") == ([3, 6, 7], [8, 9, 10])
    b.num_computed_tokens = 16  # the load finished and was verified
    coord.cache(b, 16)
    assert coord.get_unhashed_block_ids("B") == ([7], [10])
    assert coord.pool.key[3] == (b.block_hashes[2], 0) and coord.pool.key[9] == (
        b.block_hashes[3],
        1,
    )
    assert coord.pool.key[4] == (a.block_hashes[0], 1)  # outside B's window: left cached, free
    finish(coord, b)

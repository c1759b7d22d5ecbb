"""Exact block ids, slot ids and free-queue orders, computed by hand from the rules.

Rules (vLLM's, kv-reference §2.3): allocation pops the queue front (and, unlike vLLM, hands
the popped ids out ascending, so freed runs come back as runs); a block whose ref count
drops to 0 is prepended if it has no key, appended if cached; a request frees each group's table
tail first, groups in order. B = 4 throughout; block 0 is the null block.
"""

from __future__ import annotations

from hybridkv.kv.block_pool import EventKind
from hybridkv.kv.coordinator import CacheHit, KVCacheCoordinator
from hybridkv.kv.state_manager import StateCopy
from tests.kv.builders import FakeRequest, decode, make_coordinator, prefill, queue


def step(
    coord: KVCacheCoordinator, req: FakeRequest, end: int, hit: CacheHit | None = None
) -> tuple[list[StateCopy], list[StateCopy]]:
    """Allocate up to ``end``, run the step, cache; returns the step's (restores, saves)."""
    start = req.num_computed_tokens + (hit.num_tokens if hit is not None else 0)
    assert coord.allocate(req, end - start, hit)
    copies = coord.take_state_copies()
    req.num_computed_tokens = end
    coord.cache(req, end)
    coord.end_step()
    return copies


def finish(coord: KVCacheCoordinator, *reqs: FakeRequest) -> None:
    for r in reqs:
        coord.free(r)
    coord.check_integrity()
    assert coord.is_idle()


def test_full_attention_only() -> None:
    coord = make_coordinator("full", num_blocks=10)
    pool = coord.pool
    a = FakeRequest("A", list(range(10)))
    prefill(coord, a)
    assert coord.get_block_ids("A") == ([1, 2, 3],)
    assert queue(pool) == [4, 5, 6, 7, 8, 9]
    assert pool.key[1] == (a.block_hashes[0], 0) and pool.key[2] == (a.block_hashes[1], 0)
    assert pool.key[3] is None  # partial block: never cached
    coord.free(a)
    assert queue(pool) == [3, 4, 5, 6, 7, 8, 9, 2, 1]  # unkeyed to the front, tail first

    b = FakeRequest("B", list(range(8)) + [100, 101, 102])
    hit = coord.find_cache_hit(b)
    assert (hit.num_tokens, hit.block_ids) == (8, ((1, 2),))
    prefill(coord, b)
    assert coord.get_block_ids("B") == ([1, 2, 3],)
    assert queue(pool) == [4, 5, 6, 7, 8, 9]

    c = FakeRequest("C", [0, 1, 2, 3, 200, 201, 202, 203])
    hit = coord.find_cache_hit(c)
    assert (hit.num_tokens, hit.block_ids) == (4, ((1,),))  # 2 blocks match, capped at N-1
    prefill(coord, c)
    assert coord.get_block_ids("C") == ([1, 4],)
    assert pool.ref_cnt[1] == 2
    coord.free(b)
    assert queue(pool) == [3, 5, 6, 7, 8, 9, 2]  # block 1 is still C's
    coord.free(c)
    assert queue(pool) == [3, 5, 6, 7, 8, 9, 2, 4, 1]
    coord.check_integrity()

    d = FakeRequest("D", list(range(1000, 1024)))
    prefill(coord, d)
    assert coord.get_block_ids("D") == ([3, 5, 6, 7, 8, 9],)
    assert coord.find_cache_hit(FakeRequest("A2", list(range(10)))).block_ids == ((1, 2),)
    pool.take_events()
    e = FakeRequest("E", list(range(2000, 2012)))
    prefill(coord, e)
    assert coord.get_block_ids("E") == ([1, 2, 4],)  # ascending; popped 2, 4, 1 (below)
    removed = [ev.item_id for ev in pool.take_events() if ev.kind is EventKind.REMOVED]
    assert removed == [2, 4, 1]
    assert coord.find_cache_hit(FakeRequest("A3", list(range(10)))).num_tokens == 0
    assert queue(pool) == []
    f = FakeRequest("F", [7, 7, 7, 7])
    assert not coord.allocate(f, 4, coord.find_cache_hit(f))
    assert not coord.has_request("F")
    coord.check_integrity()
    finish(coord, d, e)


def test_gemma3_like_sliding_5_to_1() -> None:
    # groups: 0 full, 1..5 sliding (W = 8 -> a hit needs cdiv(7, 4) = 2 blocks)
    coord = make_coordinator("gemma3", num_blocks=40)
    pool = coord.pool
    a = FakeRequest("A", list(range(12)))
    prefill(coord, a)
    assert coord.get_block_ids("A") == (
        [1, 2, 3],
        [4, 5, 6],
        [7, 8, 9],
        [10, 11, 12],
        [13, 14, 15],
        [16, 17, 18],
    )
    assert queue(pool) == list(range(19, 40))
    decode(coord, a, 99)  # at 12 computed, tokens 0..4 leave the window: entry 0 goes null
    assert coord.get_block_ids("A") == (
        [1, 2, 3, 19],
        [0, 5, 6, 20],
        [0, 8, 9, 21],
        [0, 11, 12, 22],
        [0, 14, 15, 23],
        [0, 17, 18, 24],
    )
    assert queue(pool) == list(range(25, 40)) + [4, 7, 10, 13, 16]  # cached: to the back
    coord.check_integrity()

    b = FakeRequest("B", list(range(12)) + [50, 51, 52, 53])
    hit = coord.find_cache_hit(b)
    assert hit.num_tokens == 12
    assert hit.block_ids == ((1, 2, 3), (0, 5, 6), (0, 8, 9), (0, 11, 12), (0, 14, 15), (0, 17, 18))
    assert hit.group_hit_tokens == (12,) * 6
    prefill(coord, b)
    assert coord.get_block_ids("B") == (
        [1, 2, 3, 25],
        [0, 5, 6, 26],
        [0, 8, 9, 27],
        [0, 11, 12, 28],
        [0, 14, 15, 29],
        [0, 17, 18, 30],
    )
    assert queue(pool) == list(range(31, 40)) + [4, 7, 10, 13, 16]
    coord.free(a)
    assert queue(pool) == [24, 23, 22, 21, 20, 19, *range(31, 40), 4, 7, 10, 13, 16]
    coord.free(b)
    assert queue(pool) == [24, 23, 22, 21, 20, 19, *range(31, 40), 4, 7, 10, 13, 16] + [
        25,
        3,
        2,
        1,
        26,
        6,
        5,
        27,
        9,
        8,
        28,
        12,
        11,
        29,
        15,
        14,
        30,
        18,
        17,
    ]
    finish(coord)


def test_full_attention_plus_state_granite() -> None:
    # groups: 0 full, 1 state; 6 slots (0..5), no periodic checkpoints
    coord = make_coordinator("granite", num_blocks=16, num_state_slots=6, interval=0)
    pool, slots = coord.pool, coord.state[0].pool
    a = FakeRequest("A", list(range(10)))  # due: floor(9/4)*4 = floor(10/4)*4 = 8
    hit = coord.find_cache_hit(a)
    assert (hit.num_tokens, hit.state_slots) == (0, (None,))
    assert coord.next_step_end(a, 0, 10, hit) == 8
    assert step(coord, a, 8, hit) == ([], [StateCopy(1, 0, 1)])
    assert coord.get_block_ids("A") == ([1, 2],) and coord.get_state_slots("A") == (0,)
    assert slots.key[1] == (a.block_hashes[1], 1)
    assert queue(slots) == [2, 3, 4, 5, 1]
    assert coord.next_step_end(a, 8, 10) == 10
    assert step(coord, a, 10) == ([], [])
    a.append(500)
    assert step(coord, a, 11) == ([], [])
    a.append(501)
    assert step(coord, a, 12) == ([], [StateCopy(1, 0, 2)])  # trailing slot at 12
    assert coord.get_block_ids("A") == ([1, 2, 3],)
    coord.free(a)
    assert queue(pool) == [*range(4, 16), 3, 2, 1]
    assert queue(slots) == [0, 3, 4, 5, 1, 2]  # live slot to the front, trailing keyed at 12
    assert slots.key[2] == (a.block_hashes[2], 1)
    coord.check_integrity()

    b = FakeRequest("B", list(range(8)) + [300, 301, 302, 303, 304, 305])
    hit = coord.find_cache_hit(b)
    assert hit == CacheHit(8, ((1, 2),), (1,), (8, 8), 8)
    assert coord.next_step_end(b, 8, 14, hit) == 12  # floor(13/4)*4 = 12 is due
    assert step(coord, b, 12, hit) == ([StateCopy(1, 1, 0)], [StateCopy(1, 0, 3)])
    assert coord.get_block_ids("B") == ([1, 2, 4],) and coord.get_state_slots("B") == (0,)
    assert queue(slots) == [4, 5, 2, 3]  # checkpoint 3 published, 1 held until B is freed
    assert step(coord, b, 14) == ([], [])
    assert coord.get_block_ids("B") == ([1, 2, 4, 5],)
    coord.free(b)
    assert queue(pool) == [5, *range(6, 16), 3, 4, 2, 1]
    assert queue(slots) == [0, 4, 5, 2, 3, 1]

    # next turn of A's conversation: resumes at A's trailing state (12 tokens)
    c = FakeRequest("C", list(range(10)) + [500, 501, 600, 601, 602])
    hit = coord.find_cache_hit(c)
    assert hit == CacheHit(12, ((1, 2, 3),), (2,), (12, 12), 12)
    finish(coord)


def test_state_3_to_1_qwen35_with_interval_and_junction() -> None:
    coord = make_coordinator("qwen35", num_blocks=16, num_state_slots=6, interval=8)
    pool, slots = coord.pool, coord.state[0].pool
    a = FakeRequest("A", list(range(18)))
    assert prefill(coord, a) == [8, 16, 18]  # periodic 8, 16 (16 is also the prompt boundary)
    assert coord.get_block_ids("A") == ([1, 2, 3, 4, 5],)
    assert queue(slots) == [3, 4, 5, 1, 2]
    assert (slots.key[1], slots.key[2]) == ((a.block_hashes[1], 1), (a.block_hashes[3], 1))
    coord.free(a)
    assert queue(pool) == [5, *range(6, 16), 4, 3, 2, 1]
    assert queue(slots) == [0, 3, 4, 5, 1, 2]

    b = FakeRequest("B", list(range(12)) + list(range(700, 708)))
    hit = coord.find_cache_hit(b)
    # full attention matches 3 blocks, the state has checkpoints at 2 and 4 blocks only
    assert hit == CacheHit(8, ((1, 2),), (1,), (12, 8), 12)
    assert coord.next_step_end(b, 8, 20, hit) == 12  # the junction is due
    assert step(coord, b, 12, hit) == ([StateCopy(1, 1, 0)], [StateCopy(1, 0, 3)])
    assert coord.get_block_ids("B") == ([1, 2, 5],)
    assert pool.cached[(b.block_hashes[2], 0)].keys() == {3, 5}  # duplicates are allowed
    assert queue(slots) == [4, 5, 2, 3]  # 1 held until B is freed
    assert coord.next_step_end(b, 12, 20) == 16
    assert step(coord, b, 16) == ([], [StateCopy(1, 0, 4)])
    assert coord.next_step_end(b, 16, 20) == 20
    assert step(coord, b, 20) == ([], [StateCopy(1, 0, 5)])
    assert coord.get_block_ids("B") == ([1, 2, 5, 6, 7],)
    assert queue(slots) == [2, 3, 4, 5]

    c = FakeRequest("C", list(range(12)) + [800, 801, 802, 803])
    hit = coord.find_cache_hit(c)
    assert hit.num_tokens == 12 and hit.state_slots == (3,)  # the junction checkpoint
    assert hit.block_ids[0][:2] == (1, 2) and hit.block_ids[0][2] in (3, 5)
    finish(coord, b)


def test_two_window_sizes() -> None:
    # groups: 0 full, 1 sliding W=8 (needs 2 blocks), 2 sliding W=16 (needs cdiv(15,4) = 4)
    coord = make_coordinator("two_windows", num_blocks=40, window=8)
    pool = coord.pool
    a = FakeRequest("A", list(range(24)))
    prefill(coord, a)
    assert coord.get_block_ids("A") == (
        [1, 2, 3, 4, 5, 6],
        [7, 8, 9, 10, 11, 12],
        [13, 14, 15, 16, 17, 18],
    )
    decode(coord, a, 900)  # at 24: W=8 skips (24-7)//4 = 4 blocks, W=16 skips (24-15)//4 = 2
    assert coord.get_block_ids("A") == (
        [1, 2, 3, 4, 5, 6, 19],
        [0, 0, 0, 0, 11, 12, 20],
        [0, 0, 15, 16, 17, 18, 21],
    )
    assert queue(pool) == [*range(22, 40), 10, 9, 8, 7, 14, 13]  # freed right to left
    pool.evict(16)  # W=16's block 3 is no longer trusted

    b = FakeRequest("B", list(range(24)) + [950, 951, 952, 953])
    hit = coord.find_cache_hit(b)
    # W=16 cannot resume at 6 blocks (block 3 missing): only from block 0 up to 3 blocks;
    # W=8 then needs blocks 1 and 2, which sit cached in the free queue
    assert hit == CacheHit(12, ((1, 2, 3), (0, 8, 9), (13, 14, 15)), (), (24, 24, 12), 0)
    prefill(coord, b)
    assert coord.get_block_ids("B") == (
        [1, 2, 3, 22, 23, 24, 25],
        [0, 8, 9, 26, 27, 28, 29],
        [13, 14, 15, 30, 31, 32, 33],
    )
    assert queue(pool) == [34, 35, 36, 37, 38, 39, 10, 7]
    coord.free(a)
    assert queue(pool) == [16, 21, 20, 19, 34, 35, 36, 37, 38, 39, 10, 7, 6, 5, 4, 12, 11, 18, 17]
    finish(coord, b)

"""The checkpoint book when the pool keys two slots alike (a slot's key lost behind the book's
back, then keyed again on another slot: a failed load and its recompute): forgetting either
keeps the book consistent (found in the merged B5 run: a KeyError in ``prune``)."""

from __future__ import annotations

from hybridkv.kv.block_pool import BlockPool
from hybridkv.kv.checkpoint_book import CheckpointBook
from hybridkv.kv.checkpoints import CheckpointKind
from hybridkv.kv.hashing import BlockHash

H = BlockHash(b"h" * 32)
KEY = (H, 1)


def _keyed(pool: BlockPool) -> int:
    slot = pool.allocate(1, 1)[0]
    pool.cache(slot, KEY)
    pool.free([slot])
    return slot


def test_a_stale_entry_forgotten_leaves_the_live_one_found() -> None:
    pool = BlockPool(4, with_null=False, name="slots")
    book = CheckpointBook(pool, capacity=4)
    first, second = pool.allocate(2, 1)
    pool.cache(first, KEY)
    book.add(first, KEY, 8, CheckpointKind.PROMPT, ())
    pool.evict(first)  # its bytes no longer trusted: the book is not told
    pool.cache(second, KEY)  # the recompute keys another slot alike
    book.add(second, KEY, 8, CheckpointKind.PROMPT, ())
    pool.free([first, second])
    book.prune()
    assert set(book.entries) == {second} and book.by_hash == {H: second}
    pool.evict(second)
    book.prune()
    assert book.entries == {} and book.by_hash == {}


def test_two_live_slots_keyed_alike_either_can_go_first() -> None:
    pool = BlockPool(4, with_null=False, name="slots")
    book = CheckpointBook(pool, capacity=4)
    a, b = _keyed(pool), _keyed(pool)
    book.add(a, KEY, 8, CheckpointKind.PROMPT, ())
    book.add(b, KEY, 8, CheckpointKind.PROMPT, ())
    assert book.by_hash == {H: b}
    pool.evict(b)
    book.prune()
    assert book.by_hash == {H: a}  # the newest gone, the hash still finds the other
    assert book.evict_one() and book.entries == {} and book.by_hash == {}

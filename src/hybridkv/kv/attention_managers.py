"""Per-group block-table upkeep and hit search for full and sliding-window attention.

A request's table in a group is position-indexed: entry k holds tokens ``[k*B, (k+1)*B)``.
Sliding-window tables replace entries that left the window with the null block::

    table:  [null, null, b7, b8, b9]      window of the next token covers b7..b9
             `---------'
              skipped: freed, replaced by null (cached ones stay evictable in the pool)
"""

from __future__ import annotations

from hybridkv.kv.block_pool import NULL_BLOCK, BlockPool
from hybridkv.kv.hashing import BlockHash
from hybridkv.kv.spec import FullAttentionSpec, SlidingWindowSpec


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BaseAttentionManager:
    """Owns the tables of one attention group; every block comes from the shared pool."""

    spec: FullAttentionSpec | SlidingWindowSpec

    def __init__(self, group_id: int, pool: BlockPool) -> None:
        self.group_id = group_id
        self.pool = pool
        self.block_size = self.spec.block_size
        self.prefix = pool.cached.group(group_id)  # block hash -> ids cached in this group
        self.tables: dict[str, list[int]] = {}
        self.num_cached: dict[str, int] = {}  # leading entries registered (or hit) already

    # -- hit search (pure) ---------------------------------------------------------------

    def is_cached(self, block_hash: BlockHash) -> bool:
        return block_hash in self.prefix

    def longest_hit(self, hashes: list[BlockHash], max_blocks: int) -> int:
        """The largest k <= max_blocks such that this group can resume at k blocks."""
        raise NotImplementedError

    def num_skipped_blocks(self, num_computed: int) -> int:
        """Leading table entries the next token (at position ``num_computed``) never reads."""
        raise NotImplementedError

    def hit_block_ids(self, hashes: list[BlockHash], num_blocks: int) -> tuple[int, ...]:
        """Table entries of a hit of ``num_blocks`` blocks (null where not needed)."""
        first = self.num_skipped_blocks(num_blocks * self.block_size)
        prefix = self.prefix
        hits = [NULL_BLOCK] * first
        # any one of the blocks cached under each key (KeyError: called beyond the hit)
        for k in range(first, num_blocks):
            for b in prefix[hashes[k]]:
                hits.append(b)
                break
        return tuple(hits)

    # -- allocation ----------------------------------------------------------------------

    def num_blocks_to_allocate(
        self, req_id: str, hit_ids: tuple[int, ...], total_computed: int, num_tokens: int
    ) -> int:
        """Free-pool blocks needed to hold ``num_tokens`` (hits that sit free count too)."""
        want = cdiv(num_tokens, self.block_size)
        table = self.tables.get(req_id)
        if table is not None:
            return max(0, want - len(table))
        skipped = self.num_skipped_blocks(total_computed)
        ref_cnt = self.pool.ref_cnt  # an unreferenced hit block sits in the free queue
        evictable = 0
        for b in hit_ids[skipped:]:
            if b != NULL_BLOCK and ref_cnt[b] == 0:
                evictable += 1
        return max(0, want - max(skipped, len(hit_ids))) + evictable

    def add_hits(self, req_id: str, hit_ids: tuple[int, ...], total_computed: int) -> None:
        """Start a new request's table with its hits (phase 1: touch before any allocation)."""
        assert req_id not in self.tables, f"{req_id} already has a table in group {self.group_id}"
        skipped = self.num_skipped_blocks(total_computed)
        table = list(hit_ids)
        table[:skipped] = [NULL_BLOCK] * min(skipped, len(table))
        self.pool.touch(table)
        self.tables[req_id] = table
        self.num_cached[req_id] = len(table)

    def allocate_new(self, req_id: str, total_computed: int, num_tokens: int) -> None:
        """Extend the table to cover ``num_tokens`` tokens (phase 2)."""
        table = self.tables[req_id]
        skipped = self.num_skipped_blocks(total_computed)
        want = cdiv(num_tokens, self.block_size)
        num_null = max(0, min(skipped, want) - len(table))
        table.extend([NULL_BLOCK] * num_null)
        table.extend(self.pool.allocate(max(0, want - len(table)), self.group_id))

    def remove_skipped(self, req_id: str, num_computed: int) -> None:
        """Free entries that left the window, right to left, up to the first null one."""
        table = self.tables[req_id]
        for k in range(min(self.num_skipped_blocks(num_computed), len(table)) - 1, -1, -1):
            if table[k] == NULL_BLOCK:
                break
            self.pool.free([table[k]])
            table[k] = NULL_BLOCK

    def truncate(self, req_id: str, num_entries: int) -> None:
        """Free the table's entries from ``num_entries`` on (a finished request's tail)."""
        table = self.tables[req_id]
        self.pool.free(reversed(table[num_entries:]))
        del table[num_entries:]
        self.num_cached[req_id] = min(self.num_cached[req_id], len(table))

    # -- caching and freeing -------------------------------------------------------------

    def cache(self, req_id: str, hashes: list[BlockHash], num_tokens: int) -> None:
        """Register the full blocks of the first ``num_tokens`` tokens (their KV is final)."""
        table = self.tables[req_id]
        start = self.num_cached[req_id]
        stop = min(num_tokens // self.block_size, len(table), len(hashes))
        if stop > start:
            self.pool.cache_all(table[start:stop], hashes[start:stop], self.group_id)
            self.num_cached[req_id] = stop

    def skip_caching(self, req_id: str, num_entries: int) -> None:
        """Entries before ``num_entries`` are never registered (their bytes are not all held)."""
        self.num_cached[req_id] = max(self.num_cached[req_id], num_entries)

    def uncache_from(self, req_id: str, num_tokens: int) -> None:
        """Forget that entries from ``num_tokens`` on were registered (failure rollback)."""
        self.num_cached[req_id] = min(self.num_cached[req_id], num_tokens // self.block_size)

    def free(self, req_id: str) -> None:
        table = self.tables.pop(req_id)
        del self.num_cached[req_id]
        self.pool.free(reversed(table))

    def get_unhashed_block_ids(self, req_id: str) -> list[int]:
        return [b for b in self.tables[req_id] if b != NULL_BLOCK and self.pool.key[b] is None]


class FullAttentionManager(BaseAttentionManager):
    def __init__(self, group_id: int, spec: FullAttentionSpec, pool: BlockPool) -> None:
        self.spec = spec
        super().__init__(group_id, pool)

    def longest_hit(self, hashes: list[BlockHash], max_blocks: int) -> int:
        prefix = self.prefix
        for k in range(max_blocks):
            if hashes[k] not in prefix:
                return k
        return max_blocks

    def num_skipped_blocks(self, num_computed: int) -> int:
        return 0


class SlidingWindowManager(BaseAttentionManager):
    def __init__(self, group_id: int, spec: SlidingWindowSpec, pool: BlockPool) -> None:
        self.spec = spec
        super().__init__(group_id, pool)
        self.window = spec.sliding_window
        self.blocks_needed = cdiv(self.window - 1, self.block_size)

    def longest_hit(self, hashes: list[BlockHash], max_blocks: int) -> int:
        """Right to left: the first run of ``cdiv(W-1, B)`` cached blocks ends the hit; a
        shorter run that starts at block 0 is a hit too (nothing before it is needed)."""
        if self.blocks_needed == 0:
            return max_blocks
        prefix, needed = self.prefix, self.blocks_needed
        run, run_end = 0, max_blocks
        for k in range(max_blocks - 1, -1, -1):
            if hashes[k] in prefix:
                run += 1
                if run == needed:
                    return run_end
            else:
                run, run_end = 0, k
        return run_end

    def num_skipped_blocks(self, num_computed: int) -> int:
        return max(0, num_computed - self.window + 1) // self.block_size

"""The coordinator's read side: hit search, per-request views, and failure recovery.

``CoordinatorQueries`` is the base of ``KVCacheCoordinator``, which owns every attribute
declared here (it sets them in ``__init__``). Nothing here allocates or frees: the hit search
and the views only read the groups; ``evict_blocks`` and ``rollback`` only drop prefix-map
keys (reference counts and tables stay as they are).
"""

from __future__ import annotations

from hybridkv.kv.attention_managers import (
    BaseAttentionManager,
    FullAttentionManager,
    SlidingWindowManager,
)
from hybridkv.kv.block_pool import NULL_BLOCK, BlockPool
from hybridkv.kv.checkpoint_counters import CheckpointStats, sum_counters
from hybridkv.kv.checkpoints import RequestBoundaries
from hybridkv.kv.coordinator_types import CacheHit, KVRequest
from hybridkv.kv.spec import KVCacheLayout
from hybridkv.kv.state_manager import StateManager


class CoordinatorQueries:
    layout: KVCacheLayout
    block_size: int
    caching: bool
    pool: BlockPool
    attn: list[BaseAttentionManager]
    state: list[StateManager]
    stateless: set[str]  # finished, kept for a transfer without state slots
    _extra_due: dict[str, RequestBoundaries]  # admitted requests' extra checkpoint boundaries

    # -- hit search ----------------------------------------------------------------------

    def no_cache_hit(self) -> CacheHit:
        """A hit of no tokens (caching off, or a request that must compute its prompt)."""
        return CacheHit(
            block_ids=tuple(() for _ in self.attn), state_slots=tuple(None for _ in self.state)
        )

    def find_cache_hit(self, req: KVRequest) -> CacheHit:
        """The longest prefix valid in every group, capped at N-1 tokens. No side effects."""
        if not self.caching:
            return self.no_cache_hit()
        hashes = req.block_hashes
        max_blocks = min((req.num_tokens - 1) // self.block_size, len(hashes))
        own = [0] * len(self.layout.groups)
        num_blocks = max_blocks
        for fa in self.attn:
            if isinstance(fa, FullAttentionManager):
                num_blocks = own[fa.group_id] = fa.longest_hit(hashes, num_blocks)
        common = num_blocks
        others: list[SlidingWindowManager | StateManager] = [
            m for m in self.attn if isinstance(m, SlidingWindowManager)
        ]
        others += self.state
        # Fixed point, round robin: every answer can only lower the candidate, and a group
        # that lowered it accepts its own answer (longest_hit(h, k) == k), so the search
        # ends once every group in a row accepted the candidate. Each group's answer in the
        # first round is kept for stats.
        agreed = i = 0
        while agreed < len(others):
            m = others[i % len(others)]
            k = m.longest_hit(hashes, num_blocks)
            if i < len(others):
                own[m.group_id] = k
            agreed = 1 if k < num_blocks else agreed + 1
            num_blocks = k
            i += 1
        return CacheHit(
            num_tokens=num_blocks * self.block_size,
            block_ids=tuple(m.hit_block_ids(hashes, num_blocks) for m in self.attn),
            state_slots=tuple(m.hit_slot(hashes, num_blocks) for m in self.state),
            group_hit_tokens=tuple(n * self.block_size for n in own),
            num_common_prefix_tokens=common * self.block_size if self.state else 0,
        )

    # -- failure recovery ----------------------------------------------------------------

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Drop the prefix-map keys of blocks whose bytes are bad (ref counts untouched)."""
        for b in block_ids:
            if b != NULL_BLOCK:
                self.pool.evict(b)

    def rollback(self, req: KVRequest, num_tokens: int) -> None:
        """The request's KV is only trusted below ``num_tokens`` (a full-attention-only
        resume point): forget later registrations so recomputed blocks get cached again."""
        for m in self.attn:
            m.uncache_from(req.request_id, num_tokens)

    def first_block_index_in(self, req_id: str, block_ids: set[int], num_tokens: int) -> int | None:
        """The smallest table index below ``cdiv(num_tokens, B)`` holding one of ``block_ids``."""
        limit = -(-num_tokens // self.block_size)
        found = [
            k
            for m in self.attn
            for k, b in enumerate(m.tables.get(req_id, [])[:limit])
            if b in block_ids and b != NULL_BLOCK
        ]
        return min(found) if found else None

    @property
    def is_full_attention_only(self) -> bool:
        """Any prefix is a valid resume point only when every group is full attention."""
        return not self.state and all(isinstance(m, FullAttentionManager) for m in self.attn)

    # -- queries -------------------------------------------------------------------------

    def has_request(self, req_id: str) -> bool:
        return req_id in self._extra_due

    def get_block_ids(self, req_id: str) -> tuple[list[int], ...]:
        return tuple([m.tables[req_id] for m in self.attn])

    def copy_block_ids(self, req_id: str) -> tuple[list[int], ...]:
        """``get_block_ids`` as copies (a step's snapshot: later steps grow the tables)."""
        return tuple([m.tables[req_id][:] for m in self.attn])

    def get_state_slots(self, req_id: str) -> tuple[int, ...]:
        return tuple([sm.live[req_id] for sm in self.state]) if self.state else ()

    def get_unhashed_block_ids(self, req_id: str) -> tuple[list[int], ...]:
        """Per attention group, the real blocks not yet registered (what a load must fill)."""
        return tuple(m.get_unhashed_block_ids(req_id) for m in self.attn)

    def usage(self) -> float:
        return self.pool.usage() if self.attn else 0.0

    def checkpoint_stats(self) -> CheckpointStats:
        """The checkpoint books' counters over every state group, bytes held vs budget."""
        parts = []
        for sm in self.state:
            slot_bytes = self.layout.state_slot_bytes(sm.group_id)
            cap = sm.book.capacity
            budget = None if cap is None else cap * slot_bytes
            parts.append((sm.book.counters, sm.book.count() * slot_bytes, budget))
        return sum_counters(parts)

    def check_integrity(self) -> None:
        from hybridkv.kv.integrity import check_coordinator

        check_coordinator(self.pool, self.attn, self.state, self._extra_due, self.stateless)

    def is_idle(self) -> bool:
        """No request holds anything: every block and slot is free."""
        return (
            not self._extra_due
            and self.pool.num_free == self.pool.capacity
            and all(sm.pool.num_free == sm.pool.capacity for sm in self.state)
        )

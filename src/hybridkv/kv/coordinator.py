"""Hits across groups, allocation, caching and freeing over one layout.

A request's tokens, as one ``allocate`` call sees them::

    | computed | local hit | external | new tokens | lookahead |
    0          ^ num_computed_tokens  ^ total_computed         ^ end   (+ lookahead = table span)

Nothing is hashed at allocation: the scheduler calls ``cache(req, n)`` once the KV of the
first n tokens is final (computed by a finished step, or loaded and verified), so a block is
never registered while its bytes are in flight.

The seams (``KVRequest``, ``KVCacheConfig``, ``CacheHit``) are in ``coordinator_types.py``,
the read side (hit search, views, failure recovery) in ``coordinator_queries.py``, the state
checkpoint planning in ``coordinator_saves.py``; this file is the write side: admit, allocate,
cache, free, and the step's state copies.
"""

from __future__ import annotations

from dataclasses import replace

from hybridkv.kv.attention_managers import (
    BaseAttentionManager,
    FullAttentionManager,
    SlidingWindowManager,
)
from hybridkv.kv.block_pool import NULL_BLOCK, BlockPool
from hybridkv.kv.checkpoints import CheckpointPolicy, RequestBoundaries
from hybridkv.kv.coordinator_queries import CoordinatorQueries
from hybridkv.kv.coordinator_saves import CoordinatorSaves
from hybridkv.kv.coordinator_types import CacheHit, KVCacheConfig, KVRequest, PrefixCacheStats
from hybridkv.kv.events import CacheEvent, KVEventLog
from hybridkv.kv.spec import FullAttentionSpec, KVCacheLayout, SlidingWindowSpec, StateSpec
from hybridkv.kv.state_manager import StateCopy, StateManager


class KVCacheCoordinator(CoordinatorQueries, CoordinatorSaves):
    def __init__(self, layout: KVCacheLayout, config: KVCacheConfig) -> None:
        self.layout = layout
        self.config = config
        self.block_size = layout.block_size
        self.caching = config.enable_prefix_caching
        self.pool = BlockPool(max(config.num_blocks, 2), with_null=True, name="blocks")
        self.attn = [self._create_manager(gid) for gid in layout.attention_group_ids]
        self.state = [
            StateManager(
                g,
                _state_spec(layout, g),
                config.num_state_slots,
                self.block_size,
                config.max_checkpoints,
            )
            for g in layout.state_group_ids
        ]
        for pool in [self.pool, *(sm.pool for sm in self.state)]:
            pool.record_events = config.enable_kv_cache_events
        self.events: KVEventLog | None = None
        if config.enable_kv_cache_events and config.key_events:
            self.events = KVEventLog([self.pool, *(sm.pool for sm in self.state)])
        self.policy = CheckpointPolicy(self.block_size, config.state_checkpoint_interval)
        self.stats = PrefixCacheStats(group_hit_tokens=[0] * len(layout.groups))
        self._extra_due: dict[str, RequestBoundaries] = {}
        self.stateless: set[str] = set()  # finished, kept for a transfer without state slots
        self._restores: list[StateCopy] = []
        self._saves: list[StateCopy] = []
        self._loaded_at: dict[str, int] = {}  # a load writes the live state at this boundary
        self._no_hit = self.no_cache_hit()  # immutable: shared by every call
        # hoisted for the running-request path of allocate (full attention skips nothing)
        self._sliding = [m for m in self.attn if isinstance(m, SlidingWindowManager)]
        self._tables = [m.tables for m in self.attn]
        self._saves_states = self.caching and bool(self.state)

    def _create_manager(self, group_id: int) -> BaseAttentionManager:
        spec = self.layout.groups[group_id].spec
        if isinstance(spec, SlidingWindowSpec):
            return SlidingWindowManager(group_id, spec, self.pool)
        assert isinstance(spec, FullAttentionSpec)
        return FullAttentionManager(group_id, spec, self.pool)

    # -- allocation ----------------------------------------------------------------------

    def allocate(
        self,
        req: KVRequest,
        num_new_tokens: int,
        hit: CacheHit | None = None,
        num_external_tokens: int = 0,
        num_lookahead_tokens: int = 0,
    ) -> bool:
        """Give ``req`` room for its next step; False (and no change) if it does not fit.

        ``hit`` and ``num_external_tokens`` only apply to a request's first allocation. Every
        group's hits are touched before any group allocates new blocks.
        """
        req_id = req.request_id
        is_new = req_id not in self._extra_due
        if hit is None or not is_new:
            hit = self._no_hit
        elif num_external_tokens and any(s is not None for s in hit.state_slots):
            # The load writes the live state at the end of the external range: restoring the
            # local checkpoint too would race it.
            hit = replace(hit, state_slots=tuple(None for _ in self.state))
        total_computed = req.num_computed_tokens + hit.num_tokens + num_external_tokens
        end = total_computed + num_new_tokens
        num_tokens = end + num_lookahead_tokens
        if not is_new:
            computed = req.num_computed_tokens
            if self._loaded_at and num_new_tokens > 0:
                self._maybe_save_loaded(req, self._loaded_at.pop(req_id, None))
            for sw in self._sliding:
                sw.remove_skipped(req_id, computed)
            if self._tables_cover(req_id, num_tokens):  # a decode step inside its blocks
                if num_new_tokens > 0 and self._saves_states:
                    self._plan_saves(req, end - num_new_tokens, end)
                return True
        if not self._can_allocate(req_id, hit, total_computed, num_tokens):
            return False
        if is_new:
            self._admit(req, hit, total_computed)
            if num_external_tokens and self._saves_states:
                self._loaded_at[req_id] = total_computed
        for m in self.attn:
            m.allocate_new(req_id, total_computed, num_tokens)
        if num_new_tokens > 0:  # a step that computes nothing (an async load) saves no state
            self._plan_saves(req, end - num_new_tokens, end)
        return True

    def _tables_cover(self, req_id: str, num_tokens: int) -> bool:
        """Every attention table of a running request already spans ``num_tokens``."""
        want = -(-num_tokens // self.block_size)
        for tables in self._tables:  # noqa: SIM110 (a loop: no generator on the decode path)
            if len(tables[req_id]) < want:
                return False
        return True

    def _can_allocate(
        self, req_id: str, hit: CacheHit, total_computed: int, num_tokens: int
    ) -> bool:
        need = sum(
            m.num_blocks_to_allocate(req_id, hit.block_ids[i], total_computed, num_tokens)
            for i, m in enumerate(self.attn)
        )
        if need > self.pool.num_free:
            return False
        return all(
            m.num_slots_needed(req_id, hit.state_slots[j]) <= m.pool.num_free
            for j, m in enumerate(self.state)
        )

    def _admit(self, req: KVRequest, hit: CacheHit, total_computed: int) -> None:
        req_id = req.request_id
        for i, m in enumerate(self.attn):
            m.add_hits(req_id, hit.block_ids[i], total_computed)
        for j, sm in enumerate(self.state):
            restore = sm.add_request(req_id, hit.state_slots[j])
            if restore is not None:
                self._restores.append(restore)
        self._extra_due[req_id] = self._boundaries(req, hit)
        self._record_hit(req, hit)

    def _record_hit(self, req: KVRequest, hit: CacheHit) -> None:
        if not self.caching:
            return
        self.stats.num_queries += 1
        self.stats.queried_tokens += req.num_tokens
        self.stats.hit_tokens += hit.num_tokens
        for g, n in enumerate(hit.group_hit_tokens):
            self.stats.group_hit_tokens[g] += n

    # -- after the step ------------------------------------------------------------------

    def cache(self, req: KVRequest, num_tokens: int) -> None:
        """The KV (and state) of the request's first ``num_tokens`` tokens is final."""
        if not self.caching:
            return
        for m in self.attn:
            m.cache(req.request_id, req.block_hashes, num_tokens)
        for sm in self.state:
            sm.confirm(req.request_id, req.block_hashes, num_tokens)
        if self.events is not None:
            self.events.tag(req)

    def skip_caching(self, req: KVRequest, num_entries: tuple[int, ...]) -> None:
        """Never hash entries before ``num_entries[i]`` of attention group i's table: a load
        filled them only in part (``cache`` starts after them)."""
        for m, n in zip(self.attn, num_entries, strict=True):
            m.skip_caching(req.request_id, n)

    def take_state_copies(self) -> tuple[list[StateCopy], list[StateCopy]]:
        """Drain this step's (restores, saves)."""
        out = (self._restores, self._saves)
        self._restores, self._saves = [], []
        return out

    def take_events(self) -> list[CacheEvent]:
        """The prefix map's changes since the last call (``KVCacheConfig.
        key_events``; otherwise always empty)."""
        return self.events.take() if self.events is not None else []

    def end_step(self) -> None:
        for sm in self.state:
            sm.end_step()

    def free(self, req: KVRequest) -> None:
        req_id = req.request_id
        if req_id not in self._extra_due:
            return
        for m in self.attn:
            m.free(req_id)
        for sm in self.state:
            sm.free(req_id, req.block_hashes)
        if self.events is not None:
            self.events.tag(req)  # a final trailing state became a checkpoint
        del self._extra_due[req_id]
        self._loaded_at.pop(req_id, None)
        self.stateless.discard(req_id)

    def keep_for_transfer(self, req: KVRequest, num_tokens: int, window_at: int) -> None:
        """A finished request whose KV a transfer reads later keeps only the blocks of tokens
        ``[0, num_tokens)`` (sliding-window groups: those a step resuming at ``window_at``
        reads); its state slots are freed now (the connector copied the state it sends)."""
        req_id = req.request_id
        if req_id not in self._extra_due:
            return
        for m in self.attn:
            m.remove_skipped(req_id, window_at)
            m.truncate(req_id, -(-num_tokens // self.block_size))
        for sm in self.state:
            sm.free(req_id, req.block_hashes)
        if self.events is not None:
            self.events.tag(req)
        self.stateless.add(req_id)

    def reset_prefix_cache(self) -> bool:
        if not self.pool.reset():
            return False
        return all(sm.reset() for sm in self.state)


def _state_spec(layout: KVCacheLayout, group_id: int) -> StateSpec:
    spec = layout.groups[group_id].spec
    assert isinstance(spec, StateSpec)
    return spec


__all__ = [
    "NULL_BLOCK",
    "CacheHit",
    "KVCacheConfig",
    "KVCacheCoordinator",
    "KVRequest",
    "StateCopy",
]

"""Hits across groups, allocation, caching and freeing over one layout.

A request's tokens, as one ``allocate`` call sees them::

    | computed | local hit | external | new tokens | lookahead |
    0          ^ num_computed_tokens  ^ total_computed         ^ end   (+ lookahead = table span)

Nothing is hashed at allocation: the scheduler calls ``cache(req, n)`` once the KV of the
first n tokens is final (computed by a finished step, or loaded and verified), so a block is
never registered while its bytes are in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

from hybridkv.kv.attention_managers import (
    BaseAttentionManager,
    FullAttentionManager,
    SlidingWindowManager,
)
from hybridkv.kv.block_pool import NULL_BLOCK, BlockPool
from hybridkv.kv.checkpoints import CheckpointPolicy, RequestBoundaries
from hybridkv.kv.events import CacheEvent, KVEventLog
from hybridkv.kv.hashing import BlockHash
from hybridkv.kv.spec import FullAttentionSpec, KVCacheLayout, SlidingWindowSpec, StateSpec
from hybridkv.kv.state_manager import StateCopy, StateManager


class KVRequest(Protocol):
    """What the KV core reads of a request (the scheduler's Request satisfies it)."""

    @property
    def request_id(self) -> str: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def block_hashes(self) -> list[BlockHash]: ...
    @property
    def cache_boundaries(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class KVCacheConfig:
    num_blocks: int  # attention blocks, null block included
    num_state_slots: int = 0  # per state group: live, checkpoint and trailing slots
    enable_prefix_caching: bool = True
    state_checkpoint_interval: int = 512  # tokens; 0 = only prompt/junction/finish boundaries
    enable_kv_cache_events: bool = True  # record stored/removed events (someone must drain them)
    # the coordinator drains them itself into per-key events for ``take_events`` (KV events)
    key_events: bool = False
    # checkpoints (pending saves included) per state group; None: bounded by the slots only
    max_checkpoints: int | None = None
    # True: steps run past due boundaries and the scan hands back the states there
    # (``StateCopy.at``); False: steps end at each due boundary
    states_from_scan: bool = False


@dataclass(frozen=True, slots=True)
class CacheHit:
    """A local prefix hit valid in every group: ``num_tokens`` is a restore boundary."""

    num_tokens: int = 0
    block_ids: tuple[tuple[int, ...], ...] = ()  # per attention group (null outside windows)
    state_slots: tuple[int | None, ...] = ()  # checkpoint per state group
    group_hit_tokens: tuple[int, ...] = ()  # each group's own longest hit (stats)
    num_common_prefix_tokens: int = 0  # full-attention hit (> num_tokens: a junction to save)


@dataclass(slots=True)
class PrefixCacheStats:
    num_queries: int = 0
    queried_tokens: int = 0
    hit_tokens: int = 0
    group_hit_tokens: list[int] = field(default_factory=list)


class KVCacheCoordinator:
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

    def _boundaries(self, req: KVRequest, hit: CacheHit | None) -> RequestBoundaries:
        return self.policy.request_boundaries(
            req.num_prompt_tokens, _junction(hit), req.cache_boundaries
        )

    def _plan_saves(self, req: KVRequest, start: int, end: int) -> None:
        """Checkpoints due inside the step (from the scan), then the state at its end."""
        if not (self.caching and self.state):
            return
        extra = self._extra_due[req.request_id]
        if self.config.states_from_scan:
            for t in self.policy.due_inside(start, end, extra):
                self._save(req, t, extra, at=t)
        if end > 0 and end % self.block_size == 0:
            self._save(req, end, extra, at=None)

    def _save(
        self, req: KVRequest, boundary: int, extra: RequestBoundaries, at: int | None
    ) -> None:
        due = self.policy.is_due(boundary, extra)
        kind = self.policy.kind(boundary, extra) if due else None
        for sm in self.state:
            copy = sm.save(req.request_id, req.block_hashes, boundary, kind, at)
            if copy is not None:
                self._saves.append(copy)

    @property
    def splits_steps(self) -> bool:
        """Whether ``next_step_end`` can end a step before its tokens or budget run out
        (due state checkpoints, when states do not come from the scan)."""
        return self.caching and bool(self.state) and not self.config.states_from_scan

    def next_step_end(
        self,
        req: KVRequest,
        start: int,
        end: int,
        hit: CacheHit | None = None,
        split: bool = False,
    ) -> int:
        """Where a step computing [start, end) must stop so a due checkpoint gets taken.

        For a request not admitted yet, pass the hit it will be admitted with. ``split``
        ends steps at due boundaries even when states come from the scan (a KV connector
        saves the live state at step ends only)."""
        if not (self.caching and self.state) or (self.config.states_from_scan and not split):
            return end
        extra = self._extra_due.get(req.request_id)
        if extra is None:
            extra = self._boundaries(req, hit)
        return self.policy.clip(start, end, extra)

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

    def reset_prefix_cache(self) -> bool:
        if not self.pool.reset():
            return False
        return all(sm.reset() for sm in self.state)

    def check_integrity(self) -> None:
        from hybridkv.kv.integrity import check_coordinator

        check_coordinator(self)

    def is_idle(self) -> bool:
        """No request holds anything: every block and slot is free."""
        return (
            not self._extra_due
            and self.pool.num_free == self.pool.capacity
            and all(sm.pool.num_free == sm.pool.capacity for sm in self.state)
        )


def _junction(hit: CacheHit | None) -> int:
    """A full-attention prefix longer than the joint hit: worth a state checkpoint."""
    if hit is None or hit.num_common_prefix_tokens <= hit.num_tokens:
        return 0
    return hit.num_common_prefix_tokens


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

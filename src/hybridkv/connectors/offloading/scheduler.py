"""The scheduler half: lookups over restore units, load planning (pins), store planning.

A lookup after a local hit L walks the units ending after L, in order, while each is READY in
some tier; a unit still being stored answers "ask later" (``None``)::

    tokens   0 ...... L ....... e1 ........ e2 ........ e3      (e = unit ends, multiples of C)
             | local  |   unit 1 ready | unit 2 ready | unit 3 missing
                      '-- reported: e2 - L (full parts of units 1-2, window + state of 2)

A unit no tier holds may have been stored by another process sharing a tier (a disk directory,
a remote store): the lookup probes the tiers (``TierStack.probe``) and, if one found it or is
still asking, answers "ask later"; ``build_connector_meta`` adopts found units into that tier's
index and the next lookup reports them.

The load pins each unit in the fastest tier holding it (``update_state_after_alloc``); the
worker unpins when it is done with the bytes. Saves are planned for units whose end a step
reaches (with state groups: exactly at the step's end, where the live state is the state at
T), reserving room in every tier first (write-through); reservations are the only place
units are evicted, so nothing a lookup reported disappears before its load pins it. The
scheduler half talks to the ``TierStack`` only, never to a tier by name.
"""

from __future__ import annotations

from hybridkv.connectors.base import (
    BaseConnectorScheduler,
    KVConnectorRequest,
    RequestBlocks,
)
from hybridkv.connectors.config import LoadMode, TierName
from hybridkv.connectors.offloading.context import OffloadContext
from hybridkv.connectors.offloading.stats import OffloadingStats
from hybridkv.connectors.offloading.store_planning import StorePlanner
from hybridkv.connectors.offloading.tier import UnitState
from hybridkv.connectors.offloading.tier_base import ProbeAnswer, UnitRef
from hybridkv.connectors.offloading.tiers.cpu.tier import CpuTier
from hybridkv.connectors.offloading.tiers.disk.tier import DiskTier
from hybridkv.connectors.offloading.units import (
    OffloadLoadKeys,
    UnitPromotion,
    UnitSave,
    UnitSource,
)
from hybridkv.connectors.stats import bump
from hybridkv.connectors.tier_events import TierEvent, TierEventSink
from hybridkv.kv.block_pool import NULL_BLOCK
from hybridkv.kv.spec import SpecKind
from hybridkv.step_io import ConnectorMetadata, LoadSpec


class OffloadingScheduler(StorePlanner, BaseConnectorScheduler):
    """Lookups and load pins here; the reserving steps (saves, promotions, adoptions) in
    ``StorePlanner`` (``store_planning.py``)."""

    def __init__(self, ctx: OffloadContext, load: bool = True, save: bool = True) -> None:
        self.config, self.geometry = ctx.config, ctx.geometry
        self.stack = ctx.stack
        self.load_enabled = load
        self.save_enabled = save
        self._loads: list[LoadSpec[OffloadLoadKeys]] = []
        # hits of slower tiers to copy into the fastest: of this step, and of the step before
        self._promote: list[tuple[UnitRef, str]] = []
        self._promote_next: list[tuple[UnitRef, str]] = []
        self._sources: dict[str, dict[str, int]] = {}  # request id -> loaded tokens by tier
        self._stats = OffloadingStats()

    @property
    def cpu(self) -> CpuTier | None:
        """The CPU tier, if configured (for tests and tools; the halves use ``stack``)."""
        tier = self.stack.get(TierName.CPU)
        return tier if isinstance(tier, CpuTier) else None

    @property
    def disk(self) -> DiskTier | None:
        """The disk tier, if configured (for tests and tools)."""
        tier = self.stack.get(TierName.DISK)
        return tier if isinstance(tier, DiskTier) else None

    # -- tiers: KV events and resets -------------------------------------------------------

    def set_tier_event_sink(self, sink: TierEventSink) -> None:
        self.stack.set_event_sink(sink, self.geometry.chunk_tokens)

    def resident_units(self) -> list[TierEvent]:
        return self.stack.resident_units(self.geometry.chunk_tokens)

    def reset_tiers(self) -> int:
        return self.stack.reset()

    # -- lookup --------------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: KVConnectorRequest, num_local_computed: int
    ) -> tuple[int, bool] | None:
        if not self.load_enabled:
            return 0, False
        end = self._find_restore_end(request, num_local_computed)
        if end is None:
            return None
        if end <= num_local_computed:
            return 0, False
        return end - num_local_computed, self.config.load_mode is LoadMode.ASYNC

    def _find_restore_end(self, request: KVConnectorRequest, local: int) -> int | None:
        """The end of the last unit of the READY run after ``local`` (0 if none) that the
        tiers confirm; None if a unit of the run is still being stored, or was just found on
        disk (it is adopted in ``build_connector_meta``) or a tier is still checking. The walk
        probes the tiers until a unit is absent from all."""
        size, chunk = self.geometry.block_size, self.config.chunk_tokens
        limit = request.num_tokens - (0 if self.geometry.full_attention_only else 1)
        limit = min(limit, len(request.block_hashes) * size) // chunk * chunk
        run: list[UnitRef] = []
        found = False
        for end in range((local // chunk + 1) * chunk, limit + 1, chunk):
            unit_hash = self.geometry.unit_hash(request.block_hashes, end)
            state = self.stack.state_of(unit_hash)
            if state is None:
                answer = self.stack.probe(self._run(request, end, limit))
                if answer is ProbeAnswer.ASKING:
                    return None
                if answer is ProbeAnswer.FOUND:
                    found = True
                    continue
            if state is UnitState.PENDING:
                return None
            if state is None:
                break
            run.append(UnitRef(unit_hash, end, None))
        if found:
            return None
        confirmed = self.stack.confirm(run)
        if confirmed is None:
            return None
        return run[confirmed - 1].end if confirmed else 0

    def _run(self, request: KVConnectorRequest, end: int, limit: int) -> list[UnitRef]:
        """The request's units from the one ending at ``end`` up to ``limit``."""
        chunk = self.config.chunk_tokens
        return [
            UnitRef(
                self.geometry.unit_hash(request.block_hashes, e), e, self._parent_hash(request, e)
            )
            for e in range(end, limit + 1, chunk)
        ]

    # -- loads ---------------------------------------------------------------------------

    def update_state_after_alloc(
        self, request: KVConnectorRequest, blocks: RequestBlocks, num_external_tokens: int
    ) -> None:
        if num_external_tokens <= 0:
            if self.load_enabled:
                self._stats.misses += 1
            return
        end = request.num_computed_tokens
        start = end - num_external_tokens
        sources = self._pin_units(request, start, end)
        ids, indices = self._load_blocks(blocks, start, end)
        self._loads.append(
            LoadSpec(
                request_id=request.request_id,
                start=start,
                end=end,
                block_ids=ids,
                block_indices=indices,
                state_slots=tuple(blocks.state_slots),
                is_async=self.config.load_mode is LoadMode.ASYNC,
                keys=OffloadLoadKeys(tuple(sources)),
            )
        )

    def _pin_units(self, request: KVConnectorRequest, start: int, end: int) -> list[UnitSource]:
        """Pin every unit of [start, end) in the fastest tier holding it; record sources."""
        chunk = self.config.chunk_tokens
        sources: list[UnitSource] = []
        by_tier: dict[str, int] = {}
        for unit_end in range((start // chunk + 1) * chunk, end + chunk, chunk):
            if unit_end - chunk >= end:
                break
            unit_hash = self.geometry.unit_hash(request.block_hashes, unit_end)
            pinned = self.stack.pin_fastest(unit_hash)
            tier = None if pinned is None else pinned[0].name
            serial = None if pinned is None else pinned[1]
            sources.append(UnitSource(unit_end, unit_hash, tier, serial))
            if tier is not None and self.stack.promotion_target(tier) is not None:
                ref = UnitRef(unit_hash, unit_end, self._parent_hash(request, unit_end))
                self._promote.append((ref, tier))
            tokens = min(unit_end, end) - max(unit_end - chunk, start)
            self._count_hit(tier, tokens)
            if tier is not None:  # None: gone from every tier since the lookup (fails the load)
                by_tier[str(tier)] = by_tier.get(str(tier), 0) + tokens
        for source in reversed(sources):  # tail first: the head ends up most recent
            self.stack.touch(source.unit_hash, reuse=True)
        if sources:  # where the request resumes: the checkpoint the load stands for
            self.stack.resume(sources[-1].unit_hash)
        self._sources[request.request_id] = by_tier
        return sources

    def _load_blocks(
        self, blocks: RequestBlocks, start: int, end: int
    ) -> tuple[tuple[list[int], ...], tuple[list[int], ...]]:
        """Per attention group, the table entries of [start, end) to fill (nulls left out)."""
        size = self.geometry.block_size
        ids: list[list[int]] = []
        indices: list[list[int]] = []
        for gid, table in zip(
            self.geometry.layout.attention_group_ids, blocks.block_ids, strict=True
        ):
            first = start // size
            if self.geometry.layout.groups[gid].kind is SpecKind.SLIDING:
                first = max(first, self.geometry.first_block(gid, end))
            picked = [k for k in range(first, -(-end // size)) if table[k] != NULL_BLOCK]
            ids.append([table[k] for k in picked])
            indices.append(picked)
        return tuple(ids), tuple(indices)

    def get_hit_sources(
        self, request: KVConnectorRequest, num_external_tokens: int
    ) -> dict[str, int]:
        return dict(self._sources.pop(request.request_id, {}))

    # -- saves ---------------------------------------------------------------------------

    def get_step_interval(self, request: KVConnectorRequest) -> int:
        return self.config.chunk_tokens if self.save_enabled else 0

    def build_connector_meta(
        self, scheduled: list[tuple[KVConnectorRequest, int, int, RequestBlocks]]
    ) -> ConnectorMetadata[OffloadLoadKeys, UnitSave | UnitPromotion]:
        loads, self._loads = self._loads, []
        self._adopt_found()
        promotions = self._plan_promotions()
        # NOTE: a step computed on top of a synchronous load is not saved: a failure of that
        # load is only reported after save(), and its units would carry the bad KV on.
        sync_loaded = {spec.request_id for spec in loads if not spec.is_async}
        saves: list[UnitSave | UnitPromotion] = list(promotions)
        if self.save_enabled:
            for request, start, end, blocks in scheduled:
                if request.request_id not in sync_loaded:
                    saves.extend(self._plan_saves(request, start, end, blocks))
        return ConnectorMetadata(loads=loads, saves=saves)

    def request_finished(
        self, request: KVConnectorRequest, blocks: RequestBlocks
    ) -> tuple[bool, dict[str, object] | None]:
        self._sources.pop(request.request_id, None)
        return False, None

    def _count_hit(self, tier: str | None, tokens: int) -> None:
        if tier is None:
            self._stats.hits_gone += 1
            self._stats.hit_tokens_gone += tokens
        else:
            bump(self._stats.hits, tier)
            bump(self._stats.hit_tokens, tier, tokens)

    def take_stats(self) -> OffloadingStats:
        stats, self._stats = self._stats, OffloadingStats()
        return stats

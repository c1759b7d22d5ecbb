"""The scheduler half: lookups over restore units, load planning (pins), store planning.

A lookup after a local hit L walks the units ending after L, in order, while each is READY in
some tier; a unit still being stored answers "ask later" (``None``)::

    tokens   0 ...... L ....... e1 ........ e2 ........ e3      (e = unit ends, multiples of C)
             | local  |   unit 1 ready | unit 2 ready | unit 3 missing
                      '-- reported: e2 - L (full parts of units 1-2, window + state of 2)

A unit no tier holds may have been stored on disk by another process sharing the directory:
the lookup probes its files (``DiskTier.probe``) and, if it is complete, answers "ask later";
``build_connector_meta`` adopts it into the disk index and the next lookup reports it.

The load pins each unit in the fastest tier holding it (``update_state_after_alloc``); the
worker unpins when it is done with the bytes. Saves are planned for units whose end a step
reaches (with state groups: exactly at the step's end, where the live state is the state at
T), reserving room in every tier first (write-through); reservations are the only place
units are evicted, so nothing a lookup reported disappears before its load pins it.
"""

from __future__ import annotations

from typing import Any

from hybridkv.connectors.base import (
    BaseConnectorScheduler,
    KVConnectorRequest,
    RequestBlocks,
)
from hybridkv.connectors.config import LoadMode, Tier
from hybridkv.connectors.offloading.context import OffloadContext
from hybridkv.connectors.offloading.stats import OffloadingStats, SkipReason
from hybridkv.connectors.offloading.tier import TierIndex, UnitState
from hybridkv.connectors.offloading.units import (
    OffloadLoadKeys,
    UnitPromotion,
    UnitSave,
    UnitSource,
)
from hybridkv.connectors.stats import bump
from hybridkv.kv.block_pool import NULL_BLOCK
from hybridkv.kv.hashing import BlockHash
from hybridkv.kv.spec import SpecKind
from hybridkv.step_io import ConnectorMetadata, LoadSpec


class OffloadingScheduler(BaseConnectorScheduler):
    def __init__(self, ctx: OffloadContext, load: bool = True, save: bool = True) -> None:
        self.config, self.geometry = ctx.config, ctx.geometry
        self.cpu, self.disk = ctx.cpu, ctx.disk
        self.tiers: dict[Tier, TierIndex] = {}
        if ctx.cpu is not None:
            self.tiers[Tier.CPU] = ctx.cpu.index
        if ctx.disk is not None:
            self.tiers[Tier.DISK] = ctx.disk.index
        self.load_enabled = load
        self.save_enabled = save
        self._loads: list[LoadSpec] = []
        # disk hits to copy into the CPU tier: of this step, and of the step before (planned)
        self._promote: list[tuple[BlockHash, int, BlockHash | None]] = []
        self._promote_next: list[tuple[BlockHash, int, BlockHash | None]] = []
        self._sources: dict[str, dict[str, int]] = {}  # request id -> loaded tokens by tier
        self._stats = OffloadingStats()

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
        """The end of the last unit of the READY run after ``local`` (0 if none); None if a
        unit of the run is still being stored, or was just found on disk (it is adopted in
        ``build_connector_meta``). The walk probes the disk until a unit is absent there."""
        size, chunk = self.geometry.block_size, self.config.chunk_tokens
        limit = request.num_tokens - (0 if self.geometry.full_attention_only else 1)
        limit = min(limit, len(request.block_hashes) * size) // chunk * chunk
        best, found = 0, False
        for end in range((local // chunk + 1) * chunk, limit + 1, chunk):
            unit_hash = self.geometry.unit_hash(request.block_hashes, end)
            state = self._unit_state(unit_hash)
            if state is None and self._probe_disk(request, unit_hash, end):
                found = True
                continue
            if state is UnitState.PENDING:
                return None
            if state is None:
                break
            best = end
        return None if found else best

    def _unit_state(self, unit_hash: BlockHash) -> UnitState | None:
        """READY if some tier can serve the unit, else PENDING if one is storing it."""
        states = {index.state_of(unit_hash) for index in self.tiers.values()}
        if UnitState.READY in states:
            return UnitState.READY
        return UnitState.PENDING if UnitState.PENDING in states else None

    def _probe_disk(self, request: KVConnectorRequest, unit_hash: BlockHash, end: int) -> bool:
        """Whether another process stored the unit on disk (adopted at the next
        ``build_connector_meta``)."""
        if self.disk is None:
            return False
        return self.disk.probe(unit_hash, end, self._parent_hash(request, end))

    def _adopt_found(self) -> None:
        """Index the units lookups found on disk. NOTE: adopting reserves room and may evict,
        so it happens here, with the saves' reservations, after this step's loads pinned
        every unit a lookup reported — never inside a lookup."""
        if self.disk is None:
            return
        for unit_hash, end, parent in self.disk.take_found():
            if self._reserve(Tier.DISK, unit_hash, end, parent):
                self.disk.index.commit(unit_hash, self.disk.part_paths(unit_hash))
                self._stats.adopted_disk += 1
            else:  # no room (pinned or pending units): a miss for a while
                self.disk.mark_absent(unit_hash)

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
            tier = next((n for n, ix in self.tiers.items() if ix.pin(unit_hash)), None)
            sources.append(UnitSource(unit_end, unit_hash, tier))
            if tier == Tier.DISK:
                self._promote.append((unit_hash, unit_end, self._parent_hash(request, unit_end)))
            tokens = min(unit_end, end) - max(unit_end - chunk, start)
            self._count_hit(tier, tokens)
            if tier is not None:  # None: gone from every tier since the lookup (fails the load)
                by_tier[tier.value] = by_tier.get(tier.value, 0) + tokens
        for source in reversed(sources):  # tail first: the head ends up most recent
            for index in self.tiers.values():
                index.touch(source.unit_hash, reuse=True)
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
    ) -> ConnectorMetadata:
        loads, self._loads = self._loads, []
        self._adopt_found()
        promotions = self._plan_promotions()
        # NOTE: a step computed on top of a synchronous load is not saved: a failure of that
        # load is only reported after save(), and its units would carry the bad KV on.
        sync_loaded = {spec.request_id for spec in loads if not spec.is_async}
        saves: list[Any] = list(promotions)
        if self.save_enabled:
            for request, start, end, blocks in scheduled:
                if request.request_id not in sync_loaded:
                    saves.extend(self._plan_saves(request, start, end, blocks))
        return ConnectorMetadata(loads=loads, saves=saves)

    def _plan_promotions(self) -> list[UnitPromotion]:
        """Disk hits of the previous step to copy into the CPU tier (a step later, so their
        reads do not compete with the loads' own), each reserved there and pinned on disk until
        the worker is done. NOTE: reserving may evict, so it happens here with the saves'
        reservations, after this step's loads pinned what their lookups reported."""
        found, self._promote_next, self._promote = self._promote_next, self._promote, []
        if self.cpu is None or self.disk is None or not self.save_enabled:
            return []
        out: list[UnitPromotion] = []
        for unit_hash, end, parent in found:
            if self.cpu.index.state_of(unit_hash) is not None or not self.disk.index.pin(unit_hash):
                continue  # in the CPU tier already (or being stored), or gone from disk
            if self._reserve(Tier.CPU, unit_hash, end, parent):
                out.append(UnitPromotion(unit_hash, end))
            else:
                self.disk.index.unpin(unit_hash)
                self._stats.promotions_skipped_no_room += 1
        return out

    def _plan_saves(
        self, request: KVConnectorRequest, start: int, end: int, blocks: RequestBlocks
    ) -> list[UnitSave]:
        """Units whose end this step reaches and no tier holds or is storing yet."""
        chunk = self.config.chunk_tokens
        limit = min(end, request.num_prompt_tokens) if self.config.offload_prompt_only else end
        limit = min(limit, len(request.block_hashes) * self.geometry.block_size)
        saves: list[UnitSave] = []
        for unit_end in range((start // chunk + 1) * chunk, limit + 1, chunk):
            if self.geometry.has_state and unit_end != end:
                continue  # the live state is only the state at T when the step ends at T
            save = self._plan_unit(request, unit_end, blocks)
            if save is not None:
                saves.append(save)
            self._touch_head(request, unit_end)
        return saves

    def _plan_unit(
        self, request: KVConnectorRequest, end: int, blocks: RequestBlocks
    ) -> UnitSave | None:
        unit_hash = self.geometry.unit_hash(request.block_hashes, end)
        if any(ix.state_of(unit_hash) is not None for ix in self.tiers.values()):
            return None  # stored, or being stored
        ids = self._part_block_ids(blocks, end)
        if ids is None:
            self._skip_store(SkipReason.NULL_BLOCK)
            return None
        parent = self._parent_hash(request, end)
        tiers = [name for name in self.tiers if self._reserve(name, unit_hash, end, parent)]
        if not tiers:
            self._skip_store(SkipReason.NO_ROOM)
            return None
        return UnitSave(
            request.request_id, unit_hash, end, ids, tuple(blocks.state_slots), tuple(tiers)
        )

    def _parent_hash(self, request: KVConnectorRequest, end: int) -> BlockHash | None:
        """The unit ending C tokens before ``end`` on the request's prefix (None: first)."""
        chunk = self.config.chunk_tokens
        return self.geometry.unit_hash(request.block_hashes, end - chunk) if end > chunk else None

    def _part_block_ids(
        self, blocks: RequestBlocks, end: int
    ) -> tuple[tuple[int, ...], ...] | None:
        out: list[tuple[int, ...]] = []
        for gid, table in zip(
            self.geometry.layout.attention_group_ids, blocks.block_ids, strict=True
        ):
            ids = tuple(table[k] for k in self.geometry.part_blocks(gid, end))
            if NULL_BLOCK in ids:
                return None
            out.append(ids)
        return tuple(out)

    def _reserve(
        self, tier: Tier, unit_hash: BlockHash, end: int, parent: BlockHash | None
    ) -> bool:
        nbytes = self.geometry.unit_nbytes(end)
        evicted = self.tiers[tier].reserve(unit_hash, end, nbytes, parent)
        if evicted is None:
            return False
        if evicted:
            bump(self._stats.evictions, tier, len(evicted))
            if tier == Tier.DISK and self.disk is not None:
                self.disk.discard(evicted)
        return True

    def _touch_head(self, request: KVConnectorRequest, end: int) -> None:
        """Keep the request's earlier units more recent than the one ending at ``end``."""
        chunk = self.config.chunk_tokens
        for earlier in range(end - chunk, 0, -chunk):
            unit_hash = self.geometry.unit_hash(request.block_hashes, earlier)
            for index in self.tiers.values():
                index.touch(unit_hash)

    def request_finished(
        self, request: KVConnectorRequest, blocks: RequestBlocks
    ) -> tuple[bool, dict[str, Any] | None]:
        self._sources.pop(request.request_id, None)
        return False, None

    def _count_hit(self, tier: Tier | None, tokens: int) -> None:
        if tier is None:
            self._stats.hits_gone += 1
            self._stats.hit_tokens_gone += tokens
        else:
            bump(self._stats.hits, tier)
            bump(self._stats.hit_tokens, tier, tokens)

    def _skip_store(self, reason: SkipReason) -> None:
        self._stats.stores_skipped += 1
        bump(self._stats.stores_skipped_by, reason)

    def take_stats(self) -> OffloadingStats:
        stats, self._stats = self._stats, OffloadingStats()
        return stats

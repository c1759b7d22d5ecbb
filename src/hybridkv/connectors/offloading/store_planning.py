"""Store planning for the offloading scheduler half: saves, promotions and adoptions.

``StorePlanner`` is a base of ``OffloadingScheduler`` and holds the steps of
``build_connector_meta`` that reserve room in the tiers: adopting units other processes stored
(``_adopt_found``), promotions of the previous step's slower-tier hits (``_plan_promotions``)
and saves of the units a step's end reaches (``_plan_saves``). Contract: every reservation (and
so every eviction) happens here, after the step's loads pinned what their lookups reported; a
planned ``UnitSave`` / ``UnitPromotion`` holds a reservation in each of its target tiers (and a
promotion a pin in its source) that the worker half completes or releases.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.connectors.base import KVConnectorRequest, RequestBlocks
from hybridkv.connectors.offloading.config import OffloadingConfig
from hybridkv.connectors.offloading.stack import TierStack
from hybridkv.connectors.offloading.stats import OffloadingStats, SkipReason
from hybridkv.connectors.offloading.tier_base import Tier, UnitRef
from hybridkv.connectors.offloading.units import UnitGeometry, UnitPromotion, UnitSave
from hybridkv.connectors.stats import bump
from hybridkv.kv.block_pool import NULL_BLOCK
from hybridkv.kv.checkpoints import CheckpointKind
from hybridkv.kv.hashing import BlockHash


class StorePlanner:
    """The reserving steps of the scheduler half (see the module docstring)."""

    config: OffloadingConfig
    geometry: UnitGeometry
    stack: TierStack
    save_enabled: bool
    _stats: OffloadingStats
    # hits of slower tiers to copy into the fastest: of this step, and of the step before
    _promote: list[tuple[UnitRef, str]]
    _promote_next: list[tuple[UnitRef, str]]

    def _adopt_found(self) -> None:
        """Index the units lookups found stored by other processes. NOTE: adopting reserves
        room and may evict, so it happens here, with the saves' reservations, after this
        step's loads pinned every unit a lookup reported -- never inside a lookup."""
        for tier in self.stack:
            for unit in tier.take_found():
                if self._reserve(tier, unit.unit_hash, unit.end, unit.parent):
                    tier.index.commit(unit.unit_hash, tier.adopted_parts(unit))
                    bump(self._stats.adopted, tier.name)
                else:  # no room (pinned or pending units): a miss for a while
                    tier.mark_absent(unit.unit_hash)

    def _plan_promotions(self) -> list[UnitPromotion]:
        """Hits of slower tiers in the previous step to copy into the fastest tier (a step
        later, so their reads do not compete with the loads' own), each reserved there and
        pinned in its source until the worker is done. NOTE: reserving may evict, so it
        happens here with the saves' reservations, after this step's loads pinned what their
        lookups reported."""
        found, self._promote_next, self._promote = self._promote_next, self._promote, []
        if not self.save_enabled:
            return []
        out: list[UnitPromotion] = []
        for unit, name in found:
            source, target = self.stack.get(name), self.stack.promotion_target(name)
            if source is None or target is None or target.lookup(unit.unit_hash) is not None:
                continue  # in the target already (or being stored)
            serial = source.index.pin(unit.unit_hash)
            if serial is None:
                continue  # gone from the source
            kind = source.index.policy.kind_of(unit.unit_hash)  # its class carries over
            if kind is not None:
                target.index.policy.label(unit.unit_hash, kind)
            if self._reserve(target, unit.unit_hash, unit.end, unit.parent):
                out.append(UnitPromotion(unit.unit_hash, unit.end, name, target.name, serial))
            else:
                source.index.unpin(unit.unit_hash, serial)
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
        if any(tier.lookup(unit_hash) is not None for tier in self.stack):
            return None  # stored, or being stored
        ids = self._part_block_ids(blocks, end)
        if ids is None:
            self._skip_store(SkipReason.NULL_BLOCK)
            return None
        parent = self._parent_hash(request, end)
        kinds = UnitKinds.of(request, self.config.chunk_tokens)
        skips = {t.name: self._reserve_save(t, kinds, unit_hash, end, parent) for t in self.stack}
        tiers = [name for name, skip in skips.items() if skip is None]
        if not tiers:
            low = SkipReason.LOW_VALUE in skips.values()
            self._skip_store(SkipReason.LOW_VALUE if low else SkipReason.NO_ROOM)
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

    def _reserve_save(
        self,
        tier: Tier,
        kinds: UnitKinds,
        unit_hash: BlockHash,
        end: int,
        parent: BlockHash | None,
    ) -> SkipReason | None:
        """Reserve a save in ``tier`` (None), unless it would evict a unit worth more
        (``ValuePolicy``; the newcomer is worth what the best of the request's units it leads
        to is): then it is skipped there (``LOW_VALUE``, counted by tier); ``NO_ROOM`` if
        pinned or pending units leave no room."""
        index = tier.index
        with index.lock:
            floor = index.victims_rank(self.geometry.unit_nbytes(end))
            if floor is None:
                return SkipReason.NO_ROOM
            if floor > max(index.policy.rank_of(k, 0) for k in kinds.ahead(end)):
                bump(self._stats.value_skips, tier.name)
                return SkipReason.LOW_VALUE
            index.policy.label(unit_hash, kinds.kind(end))
        return None if self._reserve(tier, unit_hash, end, parent) else SkipReason.NO_ROOM

    def _reserve(
        self, tier: Tier, unit_hash: BlockHash, end: int, parent: BlockHash | None
    ) -> bool:
        evicted = self.stack.reserve(tier, unit_hash, end, self.geometry.unit_nbytes(end), parent)
        if evicted is None:
            return False
        if evicted:
            bump(self._stats.evictions, tier.name, evicted)
        return True

    def _touch_head(self, request: KVConnectorRequest, end: int) -> None:
        """Keep the request's earlier units more recent than the one ending at ``end``."""
        chunk = self.config.chunk_tokens
        for earlier in range(end - chunk, 0, -chunk):
            self.stack.touch(self.geometry.unit_hash(request.block_hashes, earlier))

    def _skip_store(self, reason: SkipReason) -> None:
        self._stats.stores_skipped += 1
        bump(self._stats.stores_skipped_by, reason)


@dataclass(frozen=True, slots=True)
class UnitKinds:
    """The checkpoint kind the state at each of a request's unit ends would be
    (``ValuePolicy``'s class): the prompt's last unit a lookup reaches (``PROMPT``: where
    the prompt re-sent, or the conversation's next turn, resumes from a tier), a unit a
    caller boundary (a chat message end, ``cache_boundaries``) rounds down to (``CALLER``:
    where a branch from that message resumes), else ``PERIODIC`` (a prompt's tail). Built
    once per planned unit: O(boundaries), at most ``MAX_CACHE_BOUNDARIES``."""

    prompt_last: int
    caller_ends: frozenset[int]

    @classmethod
    def of(cls, request: KVConnectorRequest, chunk: int) -> UnitKinds:
        prompt = request.num_prompt_tokens
        ends = frozenset(b // chunk * chunk for b in request.cache_boundaries if b <= prompt)
        return cls((prompt - 1) // chunk * chunk, ends)

    def kind(self, end: int) -> CheckpointKind:
        if end == self.prompt_last:
            return CheckpointKind.PROMPT
        return CheckpointKind.CALLER if end in self.caller_ends else CheckpointKind.PERIODIC

    def ahead(self, end: int) -> set[CheckpointKind]:
        """The kinds of the unit ending at ``end`` and of the request's later units: a lookup
        reaches those only through it."""
        kinds = {self.kind(end)}
        if end <= self.prompt_last:
            kinds.add(CheckpointKind.PROMPT)
        if any(end <= e for e in self.caller_ends):
            kinds.add(CheckpointKind.CALLER)
        return kinds

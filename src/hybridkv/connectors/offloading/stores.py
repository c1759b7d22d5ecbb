"""The store path: snapshots of units into the tiers, and hits promoted into the fastest tier.

``save`` snapshots the unit's blocks and states (one copy, before the blocks can be reused;
checksummed in the same pass for the CPU tier with native kernels), then a stage thread
commits the unit to the memory tier (if it was reserved there) and hands it to every slower
reserved tier's I/O worker (write-through), the memory unit pinned once per write still reading
its buffers. A ``UnitPromotion`` is read whole from its source tier on that tier's I/O worker,
verified, and written to the target tier on the target's. Snapshots held by unfinished stores
are bounded by ``max_inflight_io_bytes``: past it a store is skipped (its reservations aborted,
counted). A failed store never becomes visible: any exception on a store path (the
snapshot, the commit, a write, a tier that gave up on a stuck write or shut down) aborts the
unit's reservations, releases its pins and its in-flight bytes, and is counted
(``store_failures.<tier>``, logged at most once a minute); nothing stays PENDING.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from hybridkv.connectors.base import KVCacheAccess
from hybridkv.connectors.offloading.context import OffloadContext
from hybridkv.connectors.offloading.rate_log import RateLimitedLog
from hybridkv.connectors.offloading.stats import OffloadingStats, SkipReason
from hybridkv.connectors.offloading.store_jobs import STALL_SECONDS, Countdown, Once, on_tier
from hybridkv.connectors.offloading.tier_base import Tier
from hybridkv.connectors.offloading.tiers.cpu.tier import CpuPart, CpuTier
from hybridkv.connectors.offloading.units import UnitPromotion, UnitSave
from hybridkv.connectors.part_error import PartError
from hybridkv.connectors.stats import Direction, StatsCounter, bump
from hybridkv.step_io import ConnectorMetadata, FailureReason


class StorePipeline:
    """The worker's stores. ``cond`` is the worker's condition: it is notified as stores end."""

    cache: KVCacheAccess  # set when the worker's caches are registered

    def __init__(
        self, ctx: OffloadContext, stats: StatsCounter[OffloadingStats], cond: threading.Condition
    ) -> None:
        self.config, self.geometry = ctx.config, ctx.geometry
        self.stack = ctx.stack
        self.layout = ctx.geometry.layout
        self._stats = stats
        self._cond = cond
        self.num_stores = 0  # unfinished, under ``cond``
        self._num_ended = 0  # stores ended so far, under ``cond``
        self._inflight_bytes = 0
        self._stager = ThreadPoolExecutor(1, thread_name_prefix="offload-store")
        self._log = RateLimitedLog("OffloadingConnector stores")

    def save(self, metadata: ConnectorMetadata) -> None:
        for save in metadata.saves:
            if not isinstance(save, UnitSave | UnitPromotion):
                raise TypeError(f"OffloadingConnector cannot save {type(save).__name__}")
            nbytes = self.geometry.unit_nbytes(save.end)
            with self._cond:
                admitted = self._inflight_bytes + nbytes <= self.config.max_inflight_io_bytes
                if admitted:
                    self._inflight_bytes += nbytes
                    self.num_stores += 1
            if not admitted:
                self._abort(save, SkipReason.BACKPRESSURE)
            elif isinstance(save, UnitPromotion):
                source = self._tier(save.source)
                job = functools.partial(self._promote, save, nbytes)
                given_up = functools.partial(self._promotion_failed, save, nbytes, True)
                on_tier(source, job, save.unit_hash, given_up)
            else:
                try:
                    began = time.perf_counter()
                    parts = self._snapshot(save)
                    args = (save, parts, nbytes, time.perf_counter() - began)
                    self._stager.submit(self._store, *args)
                except Exception as exc:
                    self._store_failed(save, save.tiers, exc)
                    self._store_done(nbytes)

    def _tier(self, name: str) -> Tier:
        tier = self.stack.get(name)
        if tier is None:
            raise ValueError(f"OffloadingConnector has no {name!r} tier")
        return tier

    def _store_failed(self, save: UnitSave, tiers: Sequence[str], exc: BaseException) -> None:
        """Abort the save's reservations in ``tiers`` (counted, logged rate-limited)."""
        for name in tiers:
            self._tier(name).index.abort(save.unit_hash)
            with self._stats.update() as s:
                bump(s.store_failures, name)
        self._log.warn(f"a store failed ({', '.join(tiers)}): {exc!r}")

    def _promote(self, promotion: UnitPromotion, nbytes: int, once: Once) -> None:
        """Read a unit whole from its source tier (on the source's I/O worker), every part
        verified, then write it into the target on the target's; a bad or missing part
        aborts the target's reservation."""
        source, target = self._tier(promotion.source), self._tier(promotion.target)
        began = time.perf_counter()
        try:
            parts = source.read_unit(promotion.unit_hash, promotion.end)
        except Exception as exc:  # a failed store never becomes visible
            if once.claim():
                reason = exc.reason if isinstance(exc, PartError) else FailureReason.ERROR
                self._promotion_failed(promotion, nbytes, True, reason)
            return
        if not once.claim():  # the source gave up on this read: cleaned up already
            return
        source.index.unpin(promotion.unit_hash, promotion.source_pin)
        commit = functools.partial(self._commit_promotion, target, promotion, parts, nbytes, began)
        given_up = functools.partial(self._promotion_failed, promotion, nbytes, False)
        on_tier(target, commit, promotion.unit_hash, given_up)

    def _promotion_failed(
        self,
        promotion: UnitPromotion,
        nbytes: int,
        pinned: bool,
        reason: FailureReason = FailureReason.IO_ERROR,
    ) -> None:
        self._tier(promotion.target).index.abort(promotion.unit_hash)
        if pinned:
            self._tier(promotion.source).index.unpin(promotion.unit_hash, promotion.source_pin)
        with self._stats.update() as s:
            bump(s.promotion_failures, reason)
        self._store_done(nbytes)

    def _commit_promotion(
        self,
        target: Tier,
        promotion: UnitPromotion,
        parts: dict[int, torch.Tensor],
        nbytes: int,
        began: float,
        once: Once,
    ) -> None:
        try:
            written = target.write(promotion.unit_hash, promotion.end, dict(parts))
        except Exception as exc:
            if once.claim():
                reason = exc.reason if isinstance(exc, PartError) else FailureReason.ERROR
                self._promotion_failed(promotion, nbytes, False, reason)
            return
        if not once.claim():
            return
        if written:
            with self._stats.update() as s:
                bump(s.promotions, target.name)
                bump(s.promotion_bytes, target.name, nbytes)
                bump(s.promotion_seconds, target.name, time.perf_counter() - began)
        self._store_done(nbytes)

    def _memory_tier(self, save: UnitSave) -> CpuTier | None:
        """The memory tier the save was reserved in, if any (it is stored there first)."""
        for name in save.tiers:
            tier = self.stack.get(name)
            if isinstance(tier, CpuTier):
                return tier
        return None

    def _snapshot(self, save: UnitSave) -> dict[int, CpuPart | torch.Tensor]:
        """Copy the unit's bytes out of the device cache now. A unit bound for the CPU tier
        is checksummed in the same pass when the tier has native kernels."""
        ids_by_group = {
            gid: list(ids)
            for gid, ids in zip(self.layout.attention_group_ids, save.block_ids, strict=True)
            if ids
        }
        memory = self._memory_tier(save)
        sealed = None if memory is None else memory.snapshot(self.cache, ids_by_group)
        parts: dict[int, CpuPart | torch.Tensor] = {}
        for gid, ids in ids_by_group.items():
            parts[gid] = sealed[gid] if sealed is not None else self.cache.read_blocks(ids)
        for gid, slot in zip(self.layout.state_group_ids, save.state_slots, strict=True):
            parts[gid] = self.cache.read_state(gid, slot)  # [slot_bytes], a copy
        return parts

    def _store(
        self,
        save: UnitSave,
        parts: dict[int, CpuPart | torch.Tensor],
        nbytes: int,
        snapshot_s: float,
    ) -> None:
        """On the stage thread: commit to the memory tier, then queue the write-behinds. An
        exception fails every tier not stored yet (nothing stays PENDING)."""
        memory = self._memory_tier(save)
        behind = [self._tier(n) for n in save.tiers if memory is None or n != memory.name]
        serial = None  # of the memory entry, pinned once per write-behind reading its buffers
        try:
            if memory is not None:
                began = time.perf_counter()
                serial = memory.store(save.unit_hash, parts, pins=len(behind))
                if serial is not None:
                    seconds = snapshot_s + time.perf_counter() - began
                    with self._stats.update() as s:
                        bump(s.offload_bytes, (memory.name, Direction.STORE), nbytes)
                        bump(s.stores, memory.name)
                        bump(s.offload_seconds, (memory.name, Direction.STORE), seconds)
            data = {g: p.data if isinstance(p, CpuPart) else p for g, p in parts.items()}
        except Exception as exc:
            self._store_failed(save, save.tiers, exc)
            if memory is not None and serial is not None:
                for _ in behind:
                    memory.index.unpin(save.unit_hash, serial)
            self._store_done(nbytes)
            return
        if not behind:
            self._store_done(nbytes)
            return
        countdown = Countdown(len(behind), functools.partial(self._store_done, nbytes))
        for tier in behind:
            pin = (memory, serial) if memory is not None and serial is not None else None
            job = functools.partial(self._write_behind, tier, save, data, pin, countdown)
            given_up = functools.partial(self._write_given_up, tier, save, pin, countdown)
            on_tier(tier, job, save.unit_hash, given_up)

    def _write_behind(
        self,
        tier: Tier,
        save: UnitSave,
        parts: dict[int, torch.Tensor],
        pin: tuple[CpuTier, int] | None,
        countdown: Countdown,
        once: Once,
    ) -> None:
        began = time.perf_counter()
        try:
            written = tier.write(save.unit_hash, save.end, parts)
        except Exception as exc:
            if once.claim():
                self._write_given_up(tier, save, pin, countdown, exc)
            return
        if not once.claim():  # the tier gave up on this write (stuck): cleaned up already
            return
        with self._stats.update() as s:
            bump(s.offload_bytes, (tier.name, Direction.STORE), written)
            bump(s.offload_seconds, (tier.name, Direction.STORE), time.perf_counter() - began)
            bump(s.stores, tier.name)
        if pin is not None:
            pin[0].index.unpin(save.unit_hash, pin[1])
        countdown.tick()

    def _write_given_up(
        self,
        tier: Tier,
        save: UnitSave,
        pin: tuple[CpuTier, int] | None,
        countdown: Countdown,
        exc: BaseException | None = None,
    ) -> None:
        """A write-behind failed, or its tier gave up on it: abort, unpin, count."""
        self._store_failed(save, [tier.name], exc or OSError("given up"))
        if pin is not None:
            pin[0].index.unpin(save.unit_hash, pin[1])
        countdown.tick()

    def _store_done(self, nbytes: int) -> None:
        with self._cond:
            self._inflight_bytes -= nbytes
            self.num_stores -= 1
            self._num_ended += 1
            self._cond.notify_all()

    def _abort(self, save: UnitSave | UnitPromotion, reason: SkipReason) -> None:
        if isinstance(save, UnitPromotion):
            self._tier(save.target).index.abort(save.unit_hash)
            self._tier(save.source).index.unpin(save.unit_hash, save.source_pin)
        else:
            for name in save.tiers:
                self._tier(name).index.abort(save.unit_hash)
        with self._stats.update() as s:
            s.stores_skipped += 1
            bump(s.stores_skipped_by, reason)

    def shutdown(self) -> None:
        self._stager.shutdown(wait=True)

    def wait_for_saves(self, timeout: float | None = None) -> bool:
        """Wait for every store to end; False on ``timeout``, or as soon as none has ended for
        ``STALL_SECONDS`` (a stuck disk: its watchdog fails those stores later), so a
        shutdown never waits on a disk that does not answer."""
        began = time.monotonic()
        deadline = float("inf") if timeout is None else began + timeout
        with self._cond:
            seen, progress_at = self._num_ended, began
            while self.num_stores:
                now = time.monotonic()
                if self._num_ended != seen:
                    seen, progress_at = self._num_ended, now
                limit = min(deadline, progress_at + STALL_SECONDS)
                if now >= limit:
                    return False
                self._cond.wait(limit - now)
            return True

    def inflight_bytes(self) -> int:
        with self._cond:
            return self._inflight_bytes

"""The store path: snapshots of units into the tiers, and disk units promoted into the CPU tier.

``save`` snapshots the unit's blocks and states (one copy, before the blocks can be reused;
checksummed in the same pass for the CPU tier with native kernels), then a CPU-stage thread
commits the unit to the CPU tier and hands it to the disk tier's I/O thread (write-through),
the CPU unit pinned until its file is written. A ``UnitPromotion`` is read whole from disk,
verified, and committed to the CPU tier on the disk I/O thread. Snapshots held by unfinished
stores are bounded by ``max_inflight_io_bytes``: past it a store is skipped (its reservations
aborted, counted). A failed store never becomes visible.
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from hybridkv.connectors.base import KVCacheAccess
from hybridkv.connectors.config import Tier
from hybridkv.connectors.file_format import PartError
from hybridkv.connectors.offloading.context import OffloadContext
from hybridkv.connectors.offloading.cpu_tier import CpuPart
from hybridkv.connectors.offloading.disk_tier import DiskTier
from hybridkv.connectors.offloading.stats import OffloadingStats, SkipReason
from hybridkv.connectors.offloading.units import UnitPromotion, UnitSave
from hybridkv.connectors.stats import Direction, StatsCounter, bump
from hybridkv.step_io import ConnectorMetadata, FailureReason


class StorePipeline:
    """The worker's stores. ``cond`` is the worker's condition: it is notified as stores end."""

    cache: KVCacheAccess  # set when the worker's caches are registered

    def __init__(
        self, ctx: OffloadContext, stats: StatsCounter[OffloadingStats], cond: threading.Condition
    ) -> None:
        self.config, self.geometry = ctx.config, ctx.geometry
        self.cpu, self.disk = ctx.cpu, ctx.disk
        self.layout = ctx.geometry.layout
        self._stats = stats
        self._cond = cond
        self.num_stores = 0  # unfinished, under ``cond``
        self._inflight_bytes = 0
        self._stager = ThreadPoolExecutor(1, thread_name_prefix="offload-store")

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
                assert self.disk is not None
                self.disk.submit(functools.partial(self._promote, save, nbytes))
            else:
                began = time.perf_counter()
                parts = self._snapshot(save)
                self._stager.submit(self._store, save, parts, nbytes, time.perf_counter() - began)

    def _promote(self, promotion: UnitPromotion, nbytes: int) -> None:
        """Copy a disk unit into its CPU reservation (on the disk I/O thread), every part
        read and verified first; a bad or missing part aborts the reservation."""
        assert self.cpu is not None and self.disk is not None
        began = time.perf_counter()
        try:
            parts = self.disk.read_unit(promotion.unit_hash, promotion.end)
            if self.cpu.store(promotion.unit_hash, dict(parts)):
                with self._stats.update() as s:
                    s.promotions += 1
                    s.promotion_bytes += nbytes
                    s.promotion_seconds += time.perf_counter() - began
        except Exception as exc:  # a failed store never becomes visible
            self.cpu.index.abort(promotion.unit_hash)
            reason = exc.reason if isinstance(exc, PartError) else FailureReason.ERROR
            with self._stats.update() as s:
                bump(s.promotion_failures, reason)
        finally:
            self.disk.index.unpin(promotion.unit_hash)
            self._store_done(nbytes)

    def _snapshot(self, save: UnitSave) -> dict[int, CpuPart | torch.Tensor]:
        """Copy the unit's bytes out of the device cache now. A unit bound for the CPU tier
        is checksummed in the same pass when the tier has native kernels."""
        ids_by_group = {
            gid: list(ids)
            for gid, ids in zip(self.layout.attention_group_ids, save.block_ids, strict=True)
            if ids
        }
        sealed = None
        if Tier.CPU in save.tiers and self.cpu is not None:
            sealed = self.cpu.snapshot(self.cache, ids_by_group)
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
        disk = self.disk if Tier.DISK in save.tiers else None
        pinned = False  # the CPU unit, while the disk write-behind reads its buffers
        try:
            if Tier.CPU in save.tiers and self.cpu is not None:
                began = time.perf_counter()
                if self.cpu.store(save.unit_hash, parts, pin=disk is not None):
                    pinned = disk is not None
                    seconds = snapshot_s + time.perf_counter() - began
                    with self._stats.update() as s:
                        bump(s.offload_bytes, (Tier.CPU, Direction.STORE), nbytes)
                        bump(s.stores, Tier.CPU)
                        bump(s.offload_seconds, (Tier.CPU, Direction.STORE), seconds)
        finally:
            if disk is None:
                self._store_done(nbytes)
        if disk is not None:
            data = {g: p.data if isinstance(p, CpuPart) else p for g, p in parts.items()}
            disk.submit(lambda: self._write_disk(disk, save, data, nbytes, pinned))

    def _write_disk(
        self,
        disk: DiskTier,
        save: UnitSave,
        parts: dict[int, torch.Tensor],
        nbytes: int,
        pinned: bool,
    ) -> None:
        began = time.perf_counter()
        try:
            written = disk.write(save.unit_hash, save.end, parts)
        except Exception:
            disk.index.abort(save.unit_hash)
            with self._stats.update() as s:
                s.store_failures_disk += 1
        else:
            with self._stats.update() as s:
                bump(s.offload_bytes, (Tier.DISK, Direction.STORE), written)
                bump(s.offload_seconds, (Tier.DISK, Direction.STORE), time.perf_counter() - began)
                bump(s.stores, Tier.DISK)
        finally:
            if pinned and self.cpu is not None:
                self.cpu.index.unpin(save.unit_hash)
            self._store_done(nbytes)

    def _store_done(self, nbytes: int) -> None:
        with self._cond:
            self._inflight_bytes -= nbytes
            self.num_stores -= 1
            self._cond.notify_all()

    def _abort(self, save: UnitSave | UnitPromotion, reason: SkipReason) -> None:
        if isinstance(save, UnitPromotion):
            if self.cpu is not None and self.disk is not None:
                self.cpu.index.abort(save.unit_hash)
                self.disk.index.unpin(save.unit_hash)
        else:
            for tier in (self.cpu, self.disk):
                if tier is not None and tier.name in save.tiers:
                    tier.index.abort(save.unit_hash)
        with self._stats.update() as s:
            s.stores_skipped += 1
            bump(s.stores_skipped_by, reason)

    def shutdown(self) -> None:
        self._stager.shutdown(wait=True)

    def wait_for_saves(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.num_stores == 0, timeout)

    def inflight_bytes(self) -> int:
        with self._cond:
            return self._inflight_bytes

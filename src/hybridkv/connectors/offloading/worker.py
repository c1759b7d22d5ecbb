"""The worker half: loads from the tiers into the device cache, stores snapshots into them.

Loads run on a small thread pool (a synchronous load is waited for in ``start_load``); each
plans its parts and hands them to ``loads.PartWriter``, which verifies every byte and writes
the device (CPU parts segment by segment on two threads, disk parts whole). A load still
running after ``load_timeout_seconds`` is reported failed (``timeout``): the report waits for
device writes in progress and no write starts after it. A bad part is reported per block
(``invalid_block_ids``) or per request (``invalid_state``), counted, and its unit removed from
the tier (files deleted).

Stores: ``save`` snapshots the unit's blocks and states (one copy, before the blocks can be
reused), then a CPU-stage thread checksums and commits the unit to the CPU tier and hands it
to the disk tier's I/O thread (write-through). Snapshots held by unfinished stores are bounded
by ``max_inflight_io_bytes``: past it a store is skipped (its reservations aborted, counted).
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from hybridkv.connectors.base import (
    BaseConnectorWorker,
    ConnectorMetadata,
    ConnectorStats,
    KVCacheAccess,
    KVConnectorOutput,
    LoadResult,
    LoadSpec,
    StatsCounter,
    output_from_results,
)
from hybridkv.connectors.file_format import IO_ERROR, MISSING, PartError
from hybridkv.connectors.offloading.config import OffloadingConfig
from hybridkv.connectors.offloading.cpu_tier import CpuPart, CpuTier
from hybridkv.connectors.offloading.disk_tier import DiskTier
from hybridkv.connectors.offloading.loads import InflightLoad, LoadPart, PartWriter, plan_parts
from hybridkv.connectors.offloading.units import (
    CPU,
    DISK,
    OffloadLoadKeys,
    UnitGeometry,
    UnitPromotion,
    UnitSave,
)

TIMEOUT = "timeout"


class OffloadingWorker(BaseConnectorWorker):
    def __init__(
        self,
        config: OffloadingConfig,
        geometry: UnitGeometry,
        cpu: CpuTier | None,
        disk: DiskTier | None,
        num_load_threads: int = 2,
        num_copy_helpers: int = 1,
    ) -> None:
        self.config = config
        self.geometry = geometry
        self.layout = geometry.layout
        self.cpu = cpu
        self.disk = disk
        self._cond = threading.Condition()
        self._loads: dict[str, InflightLoad] = {}  # in flight
        self._results: list[LoadResult] = []  # finished, not reported yet
        self._num_stores = 0
        self._inflight_bytes = 0
        self._stats = StatsCounter()
        self._loader = ThreadPoolExecutor(num_load_threads, thread_name_prefix="offload-load")
        # each load's thread copies CPU segments together with up to this many helpers
        self._writer = PartWriter(geometry, cpu, disk, num_copy_helpers)
        self._stager = ThreadPoolExecutor(1, thread_name_prefix="offload-store")

    # -- loads ---------------------------------------------------------------------------

    def start_load(self, metadata: ConnectorMetadata) -> None:
        for spec in metadata.loads:
            load = InflightLoad(spec, time.monotonic())
            with self._cond:
                self._loads[spec.request_id] = load
            if not spec.is_async and _from_cpu_only(spec):
                # NOTE: on the caller's thread, without a timeout: memory copies only, no I/O
                # to hang on. The native copies then run on the caller's OpenMP team (torch's,
                # warm); a load thread's own team would fight it for the cores.
                self._run_load(load)
                continue
            self._loader.submit(self._run_load, load)
            if not spec.is_async:
                self._wait_sync(load)

    def _wait_sync(self, load: InflightLoad) -> None:
        deadline = load.started + self.config.load_timeout_seconds
        with self._cond:
            while not load.done and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
        self._maybe_time_out(load, time.monotonic(), force=True)

    def register_kv_caches(self, cache: KVCacheAccess) -> None:
        super().register_kv_caches(cache)
        self._writer.cache = cache

    def _run_load(self, load: InflightLoad) -> None:
        spec, began = load.spec, time.perf_counter()
        result = LoadResult(spec.request_id, spec.is_async)
        parts = plan_parts(self.geometry, spec)
        try:
            for part, reason in self._writer.write(load, parts):
                self._record_bad_part(part, reason, result)
            if not load.try_finish():  # timed out: the result is reported already
                return
        except Exception as exc:  # a device or programming error: fail the whole request
            result.request_reason = f"error: {type(exc).__name__}"
            self._stats.add("load_failures:error")
            if not load.try_finish():
                return
        finally:
            self._unpin(spec)
        with self._cond:
            self._loads.pop(spec.request_id, None)
            self._results.append(result)
            self._cond.notify_all()
        self._count_load_time(parts, time.perf_counter() - began)

    def _record_bad_part(self, part: LoadPart, reason: str, result: LoadResult) -> None:
        self._stats.add(f"load_failures:{reason}")
        if part.slot is None:
            result.invalid_blocks.update(dict.fromkeys(part.block_ids, reason))
        else:
            result.state_reason = result.state_reason or reason
        source = part.source
        tier = self.cpu if source.tier == CPU else self.disk
        if tier is not None and tier.index.remove(source.unit_hash) is not None:
            self._stats.add(f"removed.{source.tier}")
        if source.tier == DISK and self.disk is not None and reason not in (MISSING, IO_ERROR):
            self._stats.add("files_removed", self.disk.remove_files(source.unit_hash))

    def _unpin(self, spec: LoadSpec) -> None:
        keys = spec.keys
        if not isinstance(keys, OffloadLoadKeys):
            return
        for source in keys.units:
            tier = self.cpu if source.tier == CPU else self.disk if source.tier == DISK else None
            if tier is not None:
                tier.index.unpin(source.unit_hash)

    def _count_load_time(self, parts: list[LoadPart], seconds: float) -> None:
        nbytes: dict[str, int] = {}
        for part in parts:
            if part.slot is not None:
                size = self.layout.state_slot_bytes(part.group_id)
            else:
                size = len(part.block_ids) * self.layout.page_bytes
            nbytes[part.source.tier] = nbytes.get(part.source.tier, 0) + size
        total = sum(nbytes.values()) or 1
        for tier, size in nbytes.items():
            self._stats.add(f"offload_bytes.{tier}.load", size)
            self._stats.add(f"offload_seconds.{tier}.load", seconds * size / total)

    def _maybe_time_out(self, load: InflightLoad, now: float, force: bool = False) -> bool:
        """Give up on a load past its deadline (or now, if ``force``) unless its device
        writes already happened; its late bytes are then never written."""
        if not force and now - load.started < self.config.load_timeout_seconds:
            return False
        if not load.try_cancel():
            return False
        spec = load.spec
        result = LoadResult(spec.request_id, spec.is_async, request_reason=TIMEOUT)
        self._stats.add(f"load_failures:{TIMEOUT}")
        self._stats.add("timeouts")
        with self._cond:
            self._loads.pop(spec.request_id, None)
            self._results.append(result)
        return True

    def get_finished(self, finished_request_ids: list[str]) -> KVConnectorOutput:
        now = time.monotonic()
        with self._cond:
            in_flight = list(self._loads.values())
        for load in in_flight:
            self._maybe_time_out(load, now)
        with self._cond:
            results, self._results = self._results, []
        return output_from_results(results)

    def has_pending(self) -> bool:
        with self._cond:
            return bool(self._loads or self._results or self._num_stores)

    def wait_for_progress(self, timeout: float) -> None:
        with self._cond:
            if (self._loads or self._num_stores) and not self._results:
                self._cond.wait(timeout)

    # -- stores --------------------------------------------------------------------------

    def save(self, metadata: ConnectorMetadata) -> None:
        for save in metadata.saves:
            if not isinstance(save, UnitSave | UnitPromotion):
                raise TypeError(f"OffloadingConnector cannot save {type(save).__name__}")
            nbytes = self.geometry.unit_nbytes(save.end)
            with self._cond:
                admitted = self._inflight_bytes + nbytes <= self.config.max_inflight_io_bytes
                if admitted:
                    self._inflight_bytes += nbytes
                    self._num_stores += 1
            if not admitted:
                self._abort(save, "stores_skipped:backpressure")
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
                self._stats.add("promotions.cpu")
                self._stats.add("offload_bytes.cpu.promote", nbytes)
                self._stats.add("offload_seconds.cpu.promote", time.perf_counter() - began)
        except Exception as exc:  # a failed store never becomes visible
            self.cpu.index.abort(promotion.unit_hash)
            reason = exc.reason if isinstance(exc, PartError) else "error"
            self._stats.add(f"promotion_failures:{reason}")
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
        if CPU in save.tiers and self.cpu is not None:
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
        disk = self.disk if DISK in save.tiers else None
        pinned = False  # the CPU unit, while the disk write-behind reads its buffers
        try:
            if CPU in save.tiers and self.cpu is not None:
                began = time.perf_counter()
                if self.cpu.store(save.unit_hash, parts, pin=disk is not None):
                    pinned = disk is not None
                    self._stats.add("offload_bytes.cpu.store", nbytes)
                    self._stats.add("stores.cpu")
                    self._stats.add(
                        "offload_seconds.cpu.store", snapshot_s + time.perf_counter() - began
                    )
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
            self._stats.add("store_failures.disk")
        else:
            self._stats.add("offload_bytes.disk.store", written)
            self._stats.add("offload_seconds.disk.store", time.perf_counter() - began)
            self._stats.add("stores.disk")
        finally:
            if pinned and self.cpu is not None:
                self.cpu.index.unpin(save.unit_hash)
            self._store_done(nbytes)

    def _store_done(self, nbytes: int) -> None:
        with self._cond:
            self._inflight_bytes -= nbytes
            self._num_stores -= 1
            self._cond.notify_all()

    def _abort(self, save: UnitSave | UnitPromotion, reason: str) -> None:
        if isinstance(save, UnitPromotion):
            if self.cpu is not None and self.disk is not None:
                self.cpu.index.abort(save.unit_hash)
                self.disk.index.unpin(save.unit_hash)
        else:
            for tier in (self.cpu, self.disk):
                if tier is not None and tier.name in save.tiers:
                    tier.index.abort(save.unit_hash)
        self._stats.add("stores_skipped")
        self._stats.add(reason)

    def wait_for_saves(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._num_stores == 0, timeout)

    def inflight_bytes(self) -> int:
        with self._cond:
            return self._inflight_bytes

    # -- misc ----------------------------------------------------------------------------

    def take_stats(self) -> ConnectorStats:
        return self._stats.take()

    def shutdown(self) -> None:
        self._loader.shutdown(wait=True)
        self._writer.shutdown()
        self._stager.shutdown(wait=True)
        if self.disk is not None:
            self.disk.shutdown()


def _from_cpu_only(spec: LoadSpec) -> bool:
    keys = spec.keys
    return isinstance(keys, OffloadLoadKeys) and all(u.tier == CPU for u in keys.units)

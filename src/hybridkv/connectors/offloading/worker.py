"""The worker half: loads from the tiers into the device cache, stores snapshots into them.

Loads run on a small thread pool (a synchronous load is waited for in ``start_load``). A CPU
part is copied to the device segment by segment, each segment verified against its store-time
checksum right after its copy (the bytes are still in cache), on the load's thread and a copy
helper thread at once. A disk part (and a CPU state part) is read and verified whole, then
written: one ``write_blocks`` per run of a part's rows, one ``write_state`` per state group.
A part is written before the rest of the load is verified, never reported before its own
verification: a bad part is reported per block (``invalid_block_ids``) or per request
(``invalid_state``), counted, and its unit removed from the tier (files deleted); its blocks
were fresh to the request and are recomputed. A load still running after
``load_timeout_seconds`` is reported failed (``timeout``); the report waits for device writes
in progress and no write starts after it (``_Load``).

Stores: ``save`` snapshots the unit's blocks and states (one copy, before the blocks can be
reused), then a CPU-stage thread checksums and commits the unit to the CPU tier and hands it
to the disk tier's I/O thread (write-through). Snapshots held by unfinished stores are bounded
by ``max_inflight_io_bytes``: past it a store is skipped (its reservations aborted, counted).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from queue import Empty, SimpleQueue
from typing import Any

import numpy as np
import torch

from hybridkv.connectors.base import (
    BaseConnectorWorker,
    ConnectorMetadata,
    ConnectorStats,
    KVConnectorOutput,
    LoadResult,
    LoadSpec,
    StatsCounter,
    output_from_results,
)
from hybridkv.connectors.file_format import CORRUPT, IO_ERROR, MISSING, PartError
from hybridkv.connectors.offloading.config import OffloadingConfig
from hybridkv.connectors.offloading.cpu_tier import CpuPart, CpuTier
from hybridkv.connectors.offloading.disk_tier import DiskTier
from hybridkv.connectors.offloading.units import (
    CPU,
    DISK,
    OffloadLoadKeys,
    UnitGeometry,
    UnitSave,
    UnitSource,
)
from hybridkv.kv.spec import SpecKind

TIMEOUT = "timeout"


@dataclass(slots=True)
class _Load:
    """A load in flight. Device writes happen only between ``try_begin_write`` and
    ``end_write``; ``try_cancel`` (a timeout) lets no write start after it and waits for those
    in progress, so nothing is written once the timeout is reported."""

    spec: LoadSpec
    started: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    idle: threading.Condition = field(init=False)  # on ``lock``: no write in progress
    num_writers: int = 0
    cancelled: bool = False
    done: bool = False

    def __post_init__(self) -> None:
        self.idle = threading.Condition(self.lock)

    def try_begin_write(self) -> bool:
        with self.lock:
            if self.cancelled:
                return False
            self.num_writers += 1
            return True

    def end_write(self) -> None:
        with self.lock:
            self.num_writers -= 1
            if not self.num_writers:
                self.idle.notify_all()

    def try_cancel(self) -> bool:
        """Give up on the load unless it finished; True if this call gave it up."""
        with self.lock:
            if self.done or self.cancelled:
                return False
            self.cancelled = True
            self.idle.wait_for(lambda: not self.num_writers)
            return True

    def try_finish(self) -> bool:
        """Mark every write done; False if the load was given up on (a timeout reported it)."""
        with self.lock:
            if self.cancelled:
                return False
            self.done = True
            return True


@dataclass(slots=True)
class _Part:
    """One part a load needs: rows of the part payload -> block ids (attention) or a slot."""

    source: UnitSource
    group_id: int
    rows: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    slot: int | None = None


@dataclass(slots=True)
class _Segment:
    """The rows of one checksummed segment of a stored CPU part that a load needs."""

    part: _Part
    stored: CpuPart
    index: int
    rows: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)


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
        self._loads: dict[str, _Load] = {}  # in flight
        self._results: list[LoadResult] = []  # finished, not reported yet
        self._num_stores = 0
        self._inflight_bytes = 0
        self._stats = StatsCounter()
        self._loader = ThreadPoolExecutor(num_load_threads, thread_name_prefix="offload-load")
        # each load's thread copies CPU segments together with up to this many helpers
        self._num_copy_helpers = num_copy_helpers
        self._copier = ThreadPoolExecutor(
            max(1, num_copy_helpers), thread_name_prefix="offload-copy"
        )
        self._stager = ThreadPoolExecutor(1, thread_name_prefix="offload-store")

    # -- loads ---------------------------------------------------------------------------

    def start_load(self, metadata: ConnectorMetadata) -> None:
        for spec in metadata.loads:
            load = _Load(spec, time.monotonic())
            with self._cond:
                self._loads[spec.request_id] = load
            self._loader.submit(self._run_load, load)
            if not spec.is_async:
                self._wait_sync(load)

    def _wait_sync(self, load: _Load) -> None:
        deadline = load.started + self.config.load_timeout_seconds
        with self._cond:
            while not load.done and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
        self._maybe_time_out(load, time.monotonic(), force=True)

    def _run_load(self, load: _Load) -> None:
        spec, began = load.spec, time.perf_counter()
        result = LoadResult(spec.request_id, spec.is_async)
        parts = self._plan_parts(spec)
        try:
            segments, whole = self._split(parts, result)
            for part in self._copy_segments(load, segments):
                self._record_bad_part(part, CORRUPT, result)
            for part in whole:
                if load.cancelled:  # timed out: stop reading, the result is reported already
                    return
                payload = self._read(part, result)
                if payload is not None and not self._write_part(load, part, payload):
                    return
            if not load.try_finish():
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

    def _plan_parts(self, spec: LoadSpec) -> list[_Part]:
        """The parts the load reads and which payload row fills which block."""
        keys = spec.keys
        if not isinstance(keys, OffloadLoadKeys):
            raise TypeError(f"load of {spec.request_id} carries no offload keys")
        by_end = {s.end: s for s in keys.units}
        last = keys.units[-1]
        parts: dict[tuple[int, int], _Part] = {}
        for gid, ids, indices in zip(
            self.layout.attention_group_ids, spec.block_ids, spec.block_indices, strict=True
        ):
            sliding = self.layout.groups[gid].kind is SpecKind.SLIDING
            part, first = None, 0
            for block_id, k in zip(ids, indices, strict=True):
                end = last.end if sliding else self.geometry.unit_end_of_block(k)
                if part is None or part.source.end != end:  # the next unit's part
                    part = parts.get((end, gid)) or parts.setdefault(
                        (end, gid), _Part(by_end[end], gid)
                    )
                    first = self.geometry.first_block(gid, end)
                part.rows.append(k - first)
                part.block_ids.append(block_id)
        out = list(parts.values())
        for gid, slot in zip(self.layout.state_group_ids, spec.state_slots, strict=True):
            out.append(_Part(last, gid, slot=slot))
        return out

    def _split(self, parts: list[_Part], result: LoadResult) -> tuple[list[_Segment], list[_Part]]:
        """CPU attention parts as the segments the load needs; the other parts, read whole."""
        segments: list[_Segment] = []
        whole: list[_Part] = []
        for part in parts:
            source = part.source
            if source.tier != CPU or self.cpu is None or part.slot is not None:
                whole.append(part)
                continue
            try:
                stored = self.cpu.get(source.unit_hash, part.group_id)
            except PartError as err:
                self._record_bad_part(part, err.reason, result)
                continue
            by_index: dict[int, _Segment] = {}
            segment = None
            for row, block_id in zip(part.rows, part.block_ids, strict=True):
                index = row // stored.rows_per_segment
                if segment is None or segment.index != index:
                    segment = by_index.get(index) or by_index.setdefault(
                        index, _Segment(part, stored, index)
                    )
                segment.rows.append(row)
                segment.block_ids.append(block_id)
            segments.extend(by_index.values())
        return segments, whole

    def _copy_segments(self, load: _Load, segments: list[_Segment]) -> list[_Part]:
        """Copy and verify ``segments`` on this thread and the copy helpers (each takes the
        next segment left); the parts with a bad segment. Returns after every copy ended."""
        todo: SimpleQueue[_Segment] = SimpleQueue()
        for segment in segments:
            todo.put(segment)

        def drain() -> list[_Part]:
            bad: list[_Part] = []
            while True:
                try:
                    segment = todo.get_nowait()
                except Empty:
                    return bad
                verified = self._copy_segment(load, segment)
                if verified is None:  # given up on
                    return bad
                if not verified and segment.part not in bad:
                    bad.append(segment.part)

        num_helpers = min(self._num_copy_helpers, len(segments) - 1)
        helpers = [self._copier.submit(drain) for _ in range(num_helpers)]
        try:
            bad = drain()
        finally:  # NOTE: a helper still copying must end before this load reports anything
            wait([h for h in helpers if not h.cancel()])
        for helper in helpers:
            if not helper.cancelled():
                bad.extend(p for p in helper.result() if p not in bad)
        return bad

    def _copy_segment(self, load: _Load, segment: _Segment) -> bool | None:
        """Write the segment's rows, then verify the whole segment while its bytes are still
        in cache: whether it matched, or None (nothing written) if the load was given up."""
        if not load.try_begin_write():
            return None
        try:
            self._write_rows(segment.stored.array, segment.rows, segment.block_ids)
        finally:
            load.end_write()
        return segment.stored.verify(segment.index)

    def _read(self, part: _Part, result: LoadResult) -> torch.Tensor | None:
        """The part's verified payload, read whole, or None after recording the failure."""
        source = part.source
        try:
            if source.tier == CPU and self.cpu is not None:
                stored = self.cpu.get(source.unit_hash, part.group_id)
                if not stored.verify_all():
                    raise PartError(CORRUPT, "cpu checksum mismatch")
                return stored.data
            if source.tier == DISK and self.disk is not None:
                return self.disk.read(source.unit_hash, source.end, part.group_id)
            raise PartError(MISSING, f"unit {source.unit_hash.hex()} in no tier")
        except PartError as err:
            self._record_bad_part(part, err.reason, result)
            return None

    def _record_bad_part(self, part: _Part, reason: str, result: LoadResult) -> None:
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

    def _write_part(self, load: _Load, part: _Part, payload: torch.Tensor) -> bool:
        """Write a verified whole part; False (nothing written) if the load was given up."""
        if not load.try_begin_write():
            return False
        try:
            if part.slot is not None:
                self.cache.write_state(part.group_id, part.slot, payload.view(-1))
            else:
                self._write_rows(payload, part.rows, part.block_ids)
        finally:
            load.end_write()
        return True

    def _write_rows(self, payload: Any, rows: list[int], block_ids: list[int]) -> None:
        """Rows ``rows`` of a part payload (a uint8 array or CPU tensor) into ``block_ids``."""
        data = np.asarray(payload).reshape(-1, self.layout.group_size, self.layout.layer_page_bytes)
        if rows == list(range(rows[0], rows[0] + len(rows))):
            data = data[rows[0] : rows[0] + len(rows)]  # a contiguous run: no gather
        else:
            data = data[rows]
        self.cache.write_blocks(block_ids, data)  # data: [len(rows), G, layer_page_bytes]

    def _unpin(self, spec: LoadSpec) -> None:
        keys = spec.keys
        if not isinstance(keys, OffloadLoadKeys):
            return
        for source in keys.units:
            tier = self.cpu if source.tier == CPU else self.disk if source.tier == DISK else None
            if tier is not None:
                tier.index.unpin(source.unit_hash)

    def _count_load_time(self, parts: list[_Part], seconds: float) -> None:
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

    def _maybe_time_out(self, load: _Load, now: float, force: bool = False) -> bool:
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
            if not isinstance(save, UnitSave):
                raise TypeError(f"OffloadingConnector cannot save {type(save).__name__}")
            nbytes = self.geometry.unit_nbytes(save.end)
            with self._cond:
                admitted = self._inflight_bytes + nbytes <= self.config.max_inflight_io_bytes
                if admitted:
                    self._inflight_bytes += nbytes
                    self._num_stores += 1
            if not admitted:
                self._abort(save, "stores_skipped:backpressure")
                continue
            began = time.perf_counter()
            parts = self._snapshot(save)
            self._stager.submit(self._store, save, parts, nbytes, time.perf_counter() - began)

    def _snapshot(self, save: UnitSave) -> dict[int, torch.Tensor]:
        """Copy the unit's bytes out of the device cache now (one read for all its blocks)."""
        ids = [b for group_ids in save.block_ids for b in group_ids]
        parts: dict[int, torch.Tensor] = {}
        if ids:
            data = self.cache.read_blocks(ids)  # [n, G, layer_page_bytes], a copy
            offset = 0
            for gid, group_ids in zip(self.layout.attention_group_ids, save.block_ids, strict=True):
                parts[gid] = data[offset : offset + len(group_ids)]
                offset += len(group_ids)
        for gid, slot in zip(self.layout.state_group_ids, save.state_slots, strict=True):
            parts[gid] = self.cache.read_state(gid, slot)  # [slot_bytes], a copy
        return parts

    def _store(
        self, save: UnitSave, parts: dict[int, torch.Tensor], nbytes: int, snapshot_s: float
    ) -> None:
        disk = self.disk if DISK in save.tiers else None
        try:
            if CPU in save.tiers and self.cpu is not None:
                began = time.perf_counter()
                if self.cpu.store(save.unit_hash, parts):
                    self._stats.add("offload_bytes.cpu.store", nbytes)
                    self._stats.add("stores.cpu")
                    self._stats.add(
                        "offload_seconds.cpu.store", snapshot_s + time.perf_counter() - began
                    )
        finally:
            if disk is None:
                self._store_done(nbytes)
        if disk is not None:
            disk.submit(lambda: self._write_disk(disk, save, parts, nbytes))

    def _write_disk(
        self, disk: DiskTier, save: UnitSave, parts: dict[int, torch.Tensor], nbytes: int
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
            self._store_done(nbytes)

    def _store_done(self, nbytes: int) -> None:
        with self._cond:
            self._inflight_bytes -= nbytes
            self._num_stores -= 1
            self._cond.notify_all()

    def _abort(self, save: UnitSave, reason: str) -> None:
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
        self._copier.shutdown(wait=True)
        self._stager.shutdown(wait=True)
        if self.disk is not None:
            self.disk.shutdown()

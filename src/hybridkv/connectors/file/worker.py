"""The worker half of ``FileConnector``: reads files into the device cache and writes saves.

Loads run on a small thread pool (a sync load's ``start_load`` waits for its own), whose
threads write only the blocks and live slots of a request that waits for them. Each load reads
and verifies its files first, then writes all good blocks of the request with one
``write_blocks``. A bad file is removed (and forgotten by the index) and reported with its
reason. A load still reading after ``load_timeout_seconds`` fails with reason ``timeout``; when
its reads finally return it writes nothing (its blocks may belong to another request by then)::

    start_load -> _Flight(deadline) -> pool: read + verify files -> under the lock:
        flight still open?  yes: write blocks/states, report     no (timed out): drop it

Saves: ``save`` snapshots the bytes from the cache before it returns; a background thread then
writes one file per part, atomically, and marks it present in the index (``file.saves``).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from hybridkv.connectors.base import BaseConnectorWorker
from hybridkv.connectors.config import TierName
from hybridkv.connectors.file.format import IO_ERROR, MISSING, PartError, read_part
from hybridkv.connectors.file.saves import FileSaver
from hybridkv.connectors.file.stats import FileStats
from hybridkv.connectors.file.store import FileLoadKeys, FileStore
from hybridkv.connectors.outputs import LoadResult, output_from_results
from hybridkv.connectors.stats import Direction, StatsCounter, bump
from hybridkv.connectors.threads import SHUTDOWN_GRACE_SECONDS, stop_pool
from hybridkv.kv.spec import KVCacheLayout
from hybridkv.step_io import ConnectorMetadata, FailureReason, KVConnectorOutput, LoadSpec

TIMEOUT = FailureReason.TIMEOUT


@dataclass(slots=True)
class _Flight:
    """One load in flight: its spec and when it times out."""

    spec: LoadSpec
    deadline: float


@dataclass(slots=True)
class _ReadLoad:
    """A load's verified payloads, not yet written to the cache."""

    block_ids: list[int] = field(default_factory=list)
    block_bytes: bytearray = field(default_factory=bytearray)
    states: list[tuple[int, int, memoryview]] = field(default_factory=list)  # gid, slot, bytes


class FileConnectorWorker(FileSaver, BaseConnectorWorker):
    """Loads here; saves in ``FileSaver`` (``file/saves.py``)."""

    def __init__(
        self,
        layout: KVCacheLayout,
        store: FileStore,
        num_load_threads: int = 2,
        load_timeout_seconds: float = 30.0,
    ) -> None:
        self.layout = layout
        self.store = store
        self.load_timeout_seconds = load_timeout_seconds
        self._cond = threading.Condition()
        self._flights: dict[str, _Flight] = {}  # loads in flight (sync and async)
        self._saving: set[str] = set()  # keys being written
        self._num_saves = 0  # save jobs in flight
        self._results: list[LoadResult] = []  # finished, not yet reported
        self._stats = StatsCounter(FileStats)
        self._loader = ThreadPoolExecutor(num_load_threads, thread_name_prefix="file-load")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="file-save")

    # -- loads -------------------------------------------------------------------------------

    def start_load(self, metadata: ConnectorMetadata) -> None:
        for spec in metadata.loads:
            flight = _Flight(spec, time.monotonic() + self.load_timeout_seconds)
            with self._cond:
                self._flights[spec.request_id] = flight
            self._loader.submit(self._load, flight)
            if not spec.is_async:
                self._wait_for(spec.request_id)

    def _wait_for(self, request_id: str) -> None:
        """Until the (sync) load of ``request_id`` finished or timed out: the step waits for
        it, but not forever."""
        with self._cond:
            while request_id in self._flights:
                if not self._expire():
                    wait = self._flights[request_id].deadline - time.monotonic()
                    self._cond.wait(max(0.0, wait))

    def _load(self, flight: _Flight) -> None:
        spec = flight.spec
        result = LoadResult(spec.request_id, spec.is_async)
        began = time.perf_counter()
        try:
            read = self._read_load(spec, result)
            with self._cond:
                if self._flights.get(spec.request_id) is not flight:
                    with self._stats.update() as s:
                        s.late_loads_dropped += 1
                    return  # timed out: its blocks are no longer its own
                self._write_load(read)
        except Exception as exc:  # a device or programming error: fail the whole request
            result.request_reason = f"error: {type(exc).__name__}"
            with self._stats.update() as s:
                bump(s.load_failures, FailureReason.ERROR)
        with self._stats.update() as s:
            bump(s.offload_seconds, (TierName.DISK, Direction.LOAD), time.perf_counter() - began)
        with self._cond:
            if self._flights.get(spec.request_id) is flight:
                del self._flights[spec.request_id]
                self._results.append(result)
                self._cond.notify_all()

    def _expire(self) -> bool:
        """Fail every load past its deadline (call with ``_cond`` held); True if any."""
        now = time.monotonic()
        late = [f for f in self._flights.values() if f.deadline <= now]
        for flight in late:
            del self._flights[flight.spec.request_id]
            self._results.append(
                LoadResult(flight.spec.request_id, flight.spec.is_async, request_reason=TIMEOUT)
            )
            with self._stats.update() as s:
                bump(s.load_failures, TIMEOUT)
        return bool(late)

    def _read_load(self, spec: LoadSpec, result: LoadResult) -> _ReadLoad:
        read = _ReadLoad()
        keys = _load_keys(spec)
        size, span_len = self.layout.page_bytes, self.layout.block_size
        for ids, indices, group_keys in zip(
            spec.block_ids, spec.block_indices, keys.block_keys, strict=True
        ):
            for block_id, k, key in zip(ids, indices, group_keys, strict=True):
                payload = self._read(key, (k * span_len, (k + 1) * span_len), size)
                if isinstance(payload, str):
                    result.invalid_blocks[block_id] = payload
                    continue
                read.block_ids.append(block_id)
                read.block_bytes += payload
        groups = self.layout.state_group_ids
        for gid, slot, key in zip(groups, spec.state_slots, keys.state_keys, strict=True):
            payload = self._read(key, (0, spec.end), self.layout.state_slot_bytes(gid))
            if isinstance(payload, str):
                result.state_reason = result.state_reason or payload
                continue
            read.states.append((gid, slot, payload))
        return read

    def _write_load(self, read: _ReadLoad) -> None:
        if read.block_ids:
            data = torch.frombuffer(read.block_bytes, dtype=torch.uint8)
            # [n, G, layer_page_bytes], one device write for the whole request
            shape = (len(read.block_ids), self.layout.group_size, self.layout.layer_page_bytes)
            data = data.view(shape)
            self.cache.write_blocks(read.block_ids, data)
        nbytes = len(read.block_bytes)
        for gid, slot, payload in read.states:
            data = torch.frombuffer(payload, dtype=torch.uint8)  # [slot_bytes]
            self.cache.write_state(gid, slot, data)
            nbytes += len(payload)
        with self._stats.update() as s:
            s.load_blocks += len(read.block_ids)
            s.load_states += len(read.states)
            bump(s.offload_bytes, (TierName.DISK, Direction.LOAD), nbytes)

    def _read(self, key: str, span: tuple[int, int], payload_len: int) -> memoryview | str:
        """The verified payload of ``key``, or the failure reason (a bad file is removed)."""
        try:
            return read_part(self.store.path(key), self.store.fingerprint, key, span, payload_len)
        except PartError as err:
            removed = False
            if err.reason in (MISSING, IO_ERROR):  # nothing to remove, or not ours to judge
                self.store.forget(key)
            else:
                removed = self.store.remove(key)
            with self._stats.update() as s:
                s.files_removed += int(removed)
                bump(s.load_failures, err.reason)
            return err.reason

    def get_finished(self, finished_request_ids: list[str]) -> KVConnectorOutput:
        with self._cond:
            self._expire()
            results, self._results = self._results, []
        return output_from_results(results)

    def has_pending(self) -> bool:
        with self._cond:
            return bool(self._flights or self._results)

    def wait_for_progress(self, timeout: float) -> None:
        with self._cond:
            if self._flights and not self._results:
                first = min(f.deadline for f in self._flights.values())
                self._cond.wait(max(0.0, min(timeout, first - time.monotonic())))
                self._expire()

    # -- misc --------------------------------------------------------------------------------

    def take_stats(self) -> FileStats:
        return self._stats.take()

    def shutdown(self) -> None:
        """Saves end (the engine waited for them); queued loads are cancelled and the load
        threads joined for a few seconds at most: a stuck read must not hold the shutdown."""
        self._writer.shutdown(wait=True)
        stop_pool(self._loader, SHUTDOWN_GRACE_SECONDS)


def _load_keys(spec: LoadSpec) -> FileLoadKeys:
    if not isinstance(spec.keys, FileLoadKeys):
        raise TypeError(f"load of {spec.request_id} carries no file keys")
    return spec.keys

"""The worker half of ``FileConnector``: reads files into the device cache and writes saves.

Loads: a sync load runs inside ``start_load``; an async one on a small thread pool, whose
threads write only the blocks and live slots of a request that waits for them. Each load reads
whole files, verifies them, and writes all good blocks of the request with one ``write_blocks``.
A bad file is removed (and forgotten by the index) and reported with its reason.

Saves: ``save`` snapshots the bytes from the cache before it returns; a background thread then
writes one file per part, atomically, and marks it present in the index.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from hybridkv.connectors.base import (
    BaseConnectorWorker,
    ConnectorStats,
    LoadResult,
    StatsCounter,
    output_from_results,
)
from hybridkv.connectors.file_format import IO_ERROR, MISSING, PartError, read_part, write_part
from hybridkv.connectors.file_store import FileLoadKeys, FileSave, FileStore
from hybridkv.kv.spec import KVCacheLayout
from hybridkv.step_io import ConnectorMetadata, KVConnectorOutput, LoadSpec

_Part = tuple[str, tuple[int, int], Any]  # (key, token span, CPU uint8 tensor snapshot)


class FileConnectorWorker(BaseConnectorWorker):
    def __init__(self, layout: KVCacheLayout, store: FileStore, num_load_threads: int = 2) -> None:
        self.layout = layout
        self.store = store
        self._cond = threading.Condition()
        self._loading: set[str] = set()  # async loads in flight
        self._saving: set[str] = set()  # keys being written
        self._num_saves = 0  # save jobs in flight
        self._results: list[LoadResult] = []  # finished, not yet reported
        self._stats = StatsCounter()
        self._loader = ThreadPoolExecutor(num_load_threads, thread_name_prefix="file-load")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="file-save")

    # -- loads -------------------------------------------------------------------------------

    def start_load(self, metadata: ConnectorMetadata) -> None:
        for spec in metadata.loads:
            if not spec.is_async:
                self._finish_load(self._load(spec))
                continue
            with self._cond:
                self._loading.add(spec.request_id)
            self._loader.submit(self._load_async, spec)

    def _load_async(self, spec: LoadSpec) -> None:
        self._finish_load(self._load(spec))

    def _finish_load(self, result: LoadResult) -> None:
        with self._cond:
            self._loading.discard(result.request_id)
            self._results.append(result)
            self._cond.notify_all()

    def _load(self, spec: LoadSpec) -> LoadResult:
        result = LoadResult(spec.request_id, spec.is_async)
        began = time.perf_counter()
        try:
            self._load_blocks(spec, result)
            self._load_states(spec, result)
        except Exception as exc:  # a device or programming error: fail the whole request
            result.request_reason = f"error: {type(exc).__name__}"
            self._stats.add("load_failures:error")
        self._stats.add("offload_seconds.disk.load", time.perf_counter() - began)
        return result

    def _load_blocks(self, spec: LoadSpec, result: LoadResult) -> None:
        keys = _load_keys(spec)
        size, span_len = self.layout.page_bytes, self.layout.block_size
        good_ids: list[int] = []
        payloads = bytearray()
        for ids, indices, group_keys in zip(
            spec.block_ids, spec.block_indices, keys.block_keys, strict=True
        ):
            for block_id, k, key in zip(ids, indices, group_keys, strict=True):
                span = (k * span_len, (k + 1) * span_len)
                payload = self._read(key, span, size)
                if isinstance(payload, str):
                    result.invalid_blocks[block_id] = payload
                    continue
                good_ids.append(block_id)
                payloads += payload
        if good_ids:
            data = torch.frombuffer(payloads, dtype=torch.uint8)
            # [n, G, layer_page_bytes], one device write for the whole request
            data = data.view(len(good_ids), self.layout.group_size, self.layout.layer_page_bytes)
            self.cache.write_blocks(good_ids, data)
        self._stats.add("load_blocks", len(good_ids))
        self._stats.add("offload_bytes.disk.load", len(payloads))

    def _load_states(self, spec: LoadSpec, result: LoadResult) -> None:
        keys = _load_keys(spec)
        groups = self.layout.state_group_ids
        for gid, slot, key in zip(groups, spec.state_slots, keys.state_keys, strict=True):
            payload = self._read(key, (0, spec.end), self.layout.state_slot_bytes(gid))
            if isinstance(payload, str):
                result.state_reason = result.state_reason or payload
                continue
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)  # [slot_bytes]
            self.cache.write_state(gid, slot, data)
            self._stats.add("load_states")
            self._stats.add("offload_bytes.disk.load", len(payload))

    def _read(self, key: str, span: tuple[int, int], payload_len: int) -> memoryview | str:
        """The verified payload of ``key``, or the failure reason (a bad file is removed)."""
        try:
            return read_part(self.store.path(key), self.store.fingerprint, key, span, payload_len)
        except PartError as err:
            if err.reason in (MISSING, IO_ERROR):  # nothing to remove, or not ours to judge
                self.store.forget(key)
            elif self.store.remove(key):
                self._stats.add("files_removed")
            self._stats.add(f"load_failures:{err.reason}")
            return err.reason

    def get_finished(self, finished_request_ids: list[str]) -> KVConnectorOutput:
        with self._cond:
            results, self._results = self._results, []
        return output_from_results(results)

    def has_pending(self) -> bool:
        with self._cond:
            return bool(self._loading or self._results)

    def wait_for_progress(self, timeout: float) -> None:
        with self._cond:
            if self._loading and not self._results:
                self._cond.wait(timeout)

    # -- saves -------------------------------------------------------------------------------

    def save(self, metadata: ConnectorMetadata) -> None:
        for save in metadata.saves:
            if not isinstance(save, FileSave):
                raise TypeError(f"FileConnector cannot save {type(save).__name__}")
            blocks, states = self._snapshot(save)
            if not blocks and not states:
                continue
            with self._cond:
                self._num_saves += 1
            self._writer.submit(self._write, blocks, states)

    def _claim(self, key: str) -> bool:
        """Reserve ``key`` for this writer unless it is present or being written."""
        with self._cond:
            if key in self._saving or self.store.contains(key):
                return False
            self._saving.add(key)
            return True

    def _snapshot(self, save: FileSave) -> tuple[list[_Part], list[_Part]]:
        """Copy the bytes to save out of the cache now; keys already present are skipped."""
        claimed = [k for k in (*save.block_keys, *save.state_keys) if self._claim(k)]
        try:
            return self._snapshot_blocks(save, set(claimed)), self._snapshot_states(
                save, set(claimed)
            )
        except BaseException:
            with self._cond:
                self._saving.difference_update(claimed)
            raise

    def _snapshot_blocks(self, save: FileSave, claimed: set[str]) -> list[_Part]:
        picked = [i for i, key in enumerate(save.block_keys) if key in claimed]
        if not picked:
            return []
        ids = [save.block_ids[i] for i in picked]
        data = self.cache.read_blocks(ids).to("cpu", copy=True)  # [n, G, layer_page_bytes]
        size = self.layout.block_size
        return [
            (
                save.block_keys[i],
                (save.block_indices[i] * size, (save.block_indices[i] + 1) * size),
                data[n],
            )
            for n, i in enumerate(picked)
        ]

    def _snapshot_states(self, save: FileSave, claimed: set[str]) -> list[_Part]:
        parts: list[_Part] = []
        for gid, slot, key in zip(
            save.state_groups, save.state_slots, save.state_keys, strict=True
        ):
            if key in claimed:
                data = self.cache.read_state(gid, slot).to("cpu", copy=True)  # [slot_bytes]
                parts.append((key, (0, save.state_end), data))
        return parts

    def _write(self, blocks: list[_Part], states: list[_Part]) -> None:
        for key, span, data in blocks:
            self._write_part("store_blocks", key, span, data)
        for key, span, data in states:
            self._write_part("store_states", key, span, data)
        with self._cond:
            self._num_saves -= 1
            self._cond.notify_all()

    def _write_part(self, kind: str, key: str, span: tuple[int, int], data: Any) -> None:
        began = time.perf_counter()
        try:
            self.store.prepare_dir(key)
            payload = memoryview(data.contiguous().numpy())
            size = write_part(self.store.path(key), self.store.fingerprint, key, span, payload)
        except Exception:
            self._stats.add("store_failures")
        else:
            self.store.mark_present(key)
            self._stats.add("offload_seconds.disk.store", time.perf_counter() - began)
            self._stats.add(kind)
            self._stats.add("offload_bytes.disk.store", size)
        finally:
            with self._cond:
                self._saving.discard(key)

    def wait_for_saves(self, timeout: float | None = None) -> bool:
        """Block until every save handed over so far is on disk (or failed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._num_saves == 0, timeout)

    # -- misc --------------------------------------------------------------------------------

    def take_stats(self) -> ConnectorStats:
        return self._stats.take()

    def shutdown(self) -> None:
        self._loader.shutdown(wait=True)
        self._writer.shutdown(wait=True)


def _load_keys(spec: LoadSpec) -> FileLoadKeys:
    if not isinstance(spec.keys, FileLoadKeys):
        raise TypeError(f"load of {spec.request_id} carries no file keys")
    return spec.keys

"""The save path of ``FileConnector``'s worker half: snapshots and background file writes.

``FileSaver`` is a base of ``FileConnectorWorker``. Contract: ``save`` claims each key not
present nor being written (``_saving``), copies its bytes out of the device cache before it
returns (the blocks may be reused next step), and hands the copies to the single writer
thread, which writes one file per part atomically, marks it present in the store's index and
releases the claim whether or not the write succeeded (a failure is counted, never raised).
``wait_for_saves`` blocks until every save handed over so far has finished.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from hybridkv.connectors.base import KVCacheAccess
from hybridkv.connectors.config import TierName
from hybridkv.connectors.file.format import write_part
from hybridkv.connectors.file.stats import FileStats
from hybridkv.connectors.file.store import FileSave, FileStore
from hybridkv.connectors.stats import Direction, StatsCounter, bump
from hybridkv.kv.spec import KVCacheLayout
from hybridkv.step_io import ConnectorMetadata

if TYPE_CHECKING:
    import torch

_Part = tuple[str, tuple[int, int], "torch.Tensor"]  # (key, token span, CPU uint8 snapshot)


class FileSaver:
    """The saves of ``FileConnectorWorker`` (see the module docstring); the worker sets the
    attributes below in its constructor (``cache`` at ``register_kv_caches``)."""

    layout: KVCacheLayout
    store: FileStore
    cache: KVCacheAccess
    _cond: threading.Condition
    _saving: set[str]  # keys being written
    _num_saves: int  # save jobs in flight
    _stats: StatsCounter[FileStats]
    _writer: ThreadPoolExecutor

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

    def _write_part(self, kind: str, key: str, span: tuple[int, int], data: torch.Tensor) -> None:
        began = time.perf_counter()
        try:
            self.store.prepare_dir(key)
            payload = data.contiguous().numpy().data
            size = write_part(self.store.path(key), self.store.fingerprint, key, span, payload)
        except Exception:
            with self._stats.update() as s:
                s.store_failures += 1
        else:
            self.store.mark_present(key)
            with self._stats.update() as s:
                bump(
                    s.offload_seconds, (TierName.DISK, Direction.STORE), time.perf_counter() - began
                )
                if kind == "store_blocks":
                    s.store_blocks += 1
                else:
                    s.store_states += 1
                bump(s.offload_bytes, (TierName.DISK, Direction.STORE), size)
        finally:
            with self._cond:
                self._saving.discard(key)

    def wait_for_saves(self, timeout: float | None = None) -> bool:
        """Block until every save handed over so far is on disk (or failed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._num_saves == 0, timeout)

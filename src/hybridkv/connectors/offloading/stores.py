"""The store path: snapshots of units into the tiers, and hits promoted into the fastest tier.

``save`` snapshots the unit's blocks and states (one copy, before the blocks can be reused;
checksummed in the same pass for the CPU tier with native kernels), then a stage thread
commits the unit to the memory tier (if it was reserved there) and hands it to every slower
reserved tier's I/O worker (write-through), the memory unit pinned once per write still reading
its buffers. A ``UnitPromotion`` is read whole from its source tier on that tier's I/O worker,
verified, and written to the target tier on the target's. Snapshots held by unfinished stores
are bounded by ``max_inflight_io_bytes``: past it a store is skipped (its reservations aborted,
counted). A failed store never becomes visible.
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from hybridkv.connectors.base import KVCacheAccess, StatsCounter
from hybridkv.connectors.config import TierName
from hybridkv.connectors.file_format import PartError
from hybridkv.connectors.offloading.context import OffloadContext
from hybridkv.connectors.offloading.cpu_tier import CpuPart, CpuTier
from hybridkv.connectors.offloading.tier_base import Tier
from hybridkv.connectors.offloading.units import UnitPromotion, UnitSave
from hybridkv.step_io import ConnectorMetadata


class _Countdown:
    """Runs ``done`` when the last of ``count`` write-behinds of one store ended."""

    def __init__(self, count: int, done: Any) -> None:
        self._lock = threading.Lock()
        self._left = count
        self._done = done

    def tick(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._done()


class StorePipeline:
    """The worker's stores. ``cond`` is the worker's condition: it is notified as stores end."""

    cache: KVCacheAccess  # set when the worker's caches are registered

    def __init__(self, ctx: OffloadContext, stats: StatsCounter, cond: threading.Condition) -> None:
        self.config, self.geometry = ctx.config, ctx.geometry
        self.stack = ctx.stack
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
                self._abort(save, "stores_skipped:backpressure")
            elif isinstance(save, UnitPromotion):
                source = self._tier(save.source)
                source.submit(functools.partial(self._promote, save, nbytes))
            else:
                began = time.perf_counter()
                parts = self._snapshot(save)
                self._stager.submit(self._store, save, parts, nbytes, time.perf_counter() - began)

    def _tier(self, name: TierName) -> Tier:
        tier = self.stack.get(name)
        if tier is None:
            raise ValueError(f"OffloadingConnector has no {name!r} tier")
        return tier

    def _promote(self, promotion: UnitPromotion, nbytes: int) -> None:
        """Read a unit whole from its source tier (on the source's I/O worker), every part
        verified, then write it into the target on the target's; a bad or missing part
        aborts the target's reservation."""
        source, target = self._tier(promotion.source), self._tier(promotion.target)
        began = time.perf_counter()
        try:
            parts = source.read_unit(promotion.unit_hash, promotion.end)
        except Exception as exc:  # a failed store never becomes visible
            target.index.abort(promotion.unit_hash)
            reason = exc.reason if isinstance(exc, PartError) else "error"
            self._stats.add(f"promotion_failures:{reason}")
            self._store_done(nbytes)
            return
        finally:
            source.index.unpin(promotion.unit_hash)
        commit = functools.partial(self._commit_promotion, target, promotion, parts, nbytes, began)
        target.submit(commit)

    def _commit_promotion(
        self,
        target: Tier,
        promotion: UnitPromotion,
        parts: dict[int, torch.Tensor],
        nbytes: int,
        began: float,
    ) -> None:
        try:
            if target.write(promotion.unit_hash, promotion.end, dict(parts)):
                self._stats.add(f"promotions.{target.name}")
                self._stats.add(f"offload_bytes.{target.name}.promote", nbytes)
                self._stats.add(
                    f"offload_seconds.{target.name}.promote", time.perf_counter() - began
                )
        except Exception as exc:
            target.index.abort(promotion.unit_hash)
            reason = exc.reason if isinstance(exc, PartError) else "error"
            self._stats.add(f"promotion_failures:{reason}")
        finally:
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
        """On the stage thread: commit to the memory tier, then queue the write-behinds."""
        memory = self._memory_tier(save)
        behind = [self._tier(n) for n in save.tiers if memory is None or n != memory.name]
        pinned = False  # the memory unit, once per write-behind reading its buffers
        try:
            if memory is not None:
                began = time.perf_counter()
                if memory.store(save.unit_hash, parts, pins=len(behind)):
                    pinned = bool(behind)
                    self._stats.add(f"offload_bytes.{memory.name}.store", nbytes)
                    self._stats.add(f"stores.{memory.name}")
                    seconds = snapshot_s + time.perf_counter() - began
                    self._stats.add(f"offload_seconds.{memory.name}.store", seconds)
        finally:
            if not behind:
                self._store_done(nbytes)
        if not behind:
            return
        data = {g: p.data if isinstance(p, CpuPart) else p for g, p in parts.items()}
        countdown = _Countdown(len(behind), functools.partial(self._store_done, nbytes))
        for tier in behind:
            unpin = memory if pinned else None
            tier.submit(functools.partial(self._write_behind, tier, save, data, unpin, countdown))

    def _write_behind(
        self,
        tier: Tier,
        save: UnitSave,
        parts: dict[int, torch.Tensor],
        unpin: CpuTier | None,
        countdown: _Countdown,
    ) -> None:
        began = time.perf_counter()
        try:
            written = tier.write(save.unit_hash, save.end, parts)
        except Exception:
            tier.index.abort(save.unit_hash)
            self._stats.add(f"store_failures.{tier.name}")
        else:
            self._stats.add(f"offload_bytes.{tier.name}.store", written)
            self._stats.add(f"offload_seconds.{tier.name}.store", time.perf_counter() - began)
            self._stats.add(f"stores.{tier.name}")
        finally:
            if unpin is not None:
                unpin.index.unpin(save.unit_hash)
            countdown.tick()

    def _store_done(self, nbytes: int) -> None:
        with self._cond:
            self._inflight_bytes -= nbytes
            self.num_stores -= 1
            self._cond.notify_all()

    def _abort(self, save: UnitSave | UnitPromotion, reason: str) -> None:
        if isinstance(save, UnitPromotion):
            self._tier(save.target).index.abort(save.unit_hash)
            self._tier(save.source).index.unpin(save.unit_hash)
        else:
            for name in save.tiers:
                self._tier(name).index.abort(save.unit_hash)
        self._stats.add("stores_skipped")
        self._stats.add(reason)

    def shutdown(self) -> None:
        self._stager.shutdown(wait=True)

    def wait_for_saves(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.num_stores == 0, timeout)

    def inflight_bytes(self) -> int:
        with self._cond:
            return self._inflight_bytes

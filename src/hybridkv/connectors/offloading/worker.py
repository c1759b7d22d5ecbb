"""The worker half: loads from the tiers into the device cache, stores snapshots into them.

Loads run on a small thread pool (a synchronous load is waited for in ``start_load``; one
the CPU tier alone serves runs on the caller's thread); each plans its parts and hands them
to ``loads.PartWriter``, which verifies every byte and writes the device (CPU parts segment by
segment, checksummed in the copy's pass; disk parts whole). A load still
running after ``load_timeout_seconds`` is reported failed (``timeout``): the report waits for
device writes in progress and no write starts after it. A bad part is reported per block
(``invalid_block_ids``) or per request (``invalid_state``), counted, and its unit removed from
the tier (files deleted).

Stores (and promotions of disk units into the CPU tier) are ``stores.StorePipeline``'s.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from hybridkv.connectors.base import BaseConnectorWorker, KVCacheAccess
from hybridkv.connectors.offloading.context import OffloadContext
from hybridkv.connectors.offloading.loads import InflightLoad, LoadPart, PartWriter, plan_parts
from hybridkv.connectors.offloading.stack import TierStack
from hybridkv.connectors.offloading.stats import OffloadingStats
from hybridkv.connectors.offloading.stores import StorePipeline
from hybridkv.connectors.offloading.units import OffloadLoadKeys
from hybridkv.connectors.outputs import LoadResult, output_from_results
from hybridkv.connectors.stats import Direction, StatsCounter, bump
from hybridkv.step_io import ConnectorMetadata, FailureReason, KVConnectorOutput, LoadSpec

TIMEOUT = FailureReason.TIMEOUT


class OffloadingWorker(BaseConnectorWorker):
    def __init__(
        self, ctx: OffloadContext, num_load_threads: int = 2, num_copy_helpers: int = 1
    ) -> None:
        self.config, self.geometry = ctx.config, ctx.geometry
        self.stack = ctx.stack
        self.layout = ctx.geometry.layout
        self._cond = threading.Condition()
        self._loads: dict[str, InflightLoad] = {}  # in flight
        self._results: list[LoadResult] = []  # finished, not reported yet
        self._stats = StatsCounter(OffloadingStats)
        self._loader = ThreadPoolExecutor(num_load_threads, thread_name_prefix="offload-load")
        # each load's thread copies CPU segments together with up to this many helpers
        self._writer = PartWriter(ctx.geometry, ctx.stack, num_copy_helpers)
        self._stores = StorePipeline(ctx, self._stats, self._cond)
        for tier in self.stack:
            tier.progress = self._notify  # a probe's answer is progress for a waiting lookup

    # -- loads ---------------------------------------------------------------------------

    def start_load(self, metadata: ConnectorMetadata) -> None:
        for spec in metadata.loads:
            started = time.monotonic()
            load = InflightLoad(spec, started, started + self.config.load_timeout_seconds)
            with self._cond:
                self._loads[spec.request_id] = load
            if not spec.is_async and _from_memory_only(self.stack, spec):
                # NOTE: on the caller's thread, without a timeout: memory copies only, no I/O
                # to hang on. The native copies then run on the caller's OpenMP team (torch's,
                # warm); a load thread's own team would fight it for the cores.
                self._run_load(load)
                continue
            self._loader.submit(self._run_load, load)
            if not spec.is_async:
                self._wait_sync(load)

    def _wait_sync(self, load: InflightLoad) -> None:
        deadline = load.deadline
        with self._cond:
            while not load.done and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
        self._maybe_time_out(load, time.monotonic(), force=True)

    def register_kv_caches(self, cache: KVCacheAccess) -> None:
        super().register_kv_caches(cache)
        self._writer.cache = cache
        self._stores.cache = cache

    def _run_load(self, load: InflightLoad) -> None:
        spec, began = load.spec, time.perf_counter()
        result = LoadResult(spec.request_id, spec.is_async)
        parts = plan_parts(self.geometry, spec)
        try:
            bad = self._writer.write(load, parts)
            finished = load.try_finish()  # False: timed out, the result is reported already
            for part, reason in bad:
                self._discard_bad(part, reason)
                if finished:
                    self._record_bad_part(part, reason, result)
            if not finished:
                return
        except Exception as exc:  # a device or programming error: fail the whole request
            result.request_reason = f"error: {type(exc).__name__}"
            with self._stats.update() as s:
                bump(s.load_failures, FailureReason.ERROR)
            if not load.try_finish():
                return
        finally:
            self._unpin(spec)
        with self._cond:
            self._loads.pop(spec.request_id, None)
            self._results.append(result)
            self._cond.notify_all()
        self._count_load_time(parts, time.perf_counter() - began)

    def _record_bad_part(self, part: LoadPart, reason: FailureReason, result: LoadResult) -> None:
        with self._stats.update() as s:
            bump(s.load_failures, reason)
        if part.slot is None:
            result.invalid_blocks.update(dict.fromkeys(part.block_ids, reason))
        else:
            result.state_reason = result.state_reason or reason

    def _discard_bad(self, part: LoadPart, reason: FailureReason) -> None:
        """A part failed: its unit leaves its tier (stored objects deleted unless the reason
        says they are gone or unreadable); a part that was only too slow stays."""
        source = part.source
        tier = self.stack.get(source.tier)
        if tier is None or reason is TIMEOUT:  # too slow is not bad: the unit stays
            return
        indexed = tier.index.get(source.unit_hash) is not None
        removed = tier.discard_bad(source.unit_hash, reason)
        with self._stats.update() as s:
            if indexed:
                bump(s.removed, tier.name)
            if tier.removed_counter is not None:
                bump(s.objects_removed, tier.removed_counter, removed)

    def _unpin(self, spec: LoadSpec) -> None:
        keys = spec.keys
        if not isinstance(keys, OffloadLoadKeys):
            return
        for source in keys.units:
            self.stack.unpin(source.tier, source.unit_hash, source.pin)

    def _count_load_time(self, parts: list[LoadPart], seconds: float) -> None:
        nbytes: dict[str, int] = {}
        for part in parts:
            if part.source.tier is None:
                continue  # no tier held the unit: nothing was read
            if part.slot is not None:
                size = self.layout.state_slot_bytes(part.group_id)
            else:
                size = len(part.block_ids) * self.layout.page_bytes
            nbytes[part.source.tier] = nbytes.get(part.source.tier, 0) + size
        total = sum(nbytes.values()) or 1
        with self._stats.update() as s:
            for tier, size in nbytes.items():
                bump(s.offload_bytes, (tier, Direction.LOAD), size)
                bump(s.offload_seconds, (tier, Direction.LOAD), seconds * size / total)

    def _maybe_time_out(self, load: InflightLoad, now: float, force: bool = False) -> bool:
        """Give up on a load past its deadline (or now, if ``force``) unless its device
        writes already happened; its late bytes are then never written."""
        if not force and now - load.started < self.config.load_timeout_seconds:
            return False
        if not load.try_cancel():
            return False
        spec = load.spec
        result = LoadResult(spec.request_id, spec.is_async, request_reason=TIMEOUT)
        with self._stats.update() as s:
            bump(s.load_failures, TIMEOUT)
            s.timeouts += 1
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
        probing = any(t.probing() for t in self.stack)
        with self._cond:
            return bool(self._loads or self._results or self._stores.num_stores or probing)

    def wait_for_progress(self, timeout: float) -> None:
        probing = any(t.probing() for t in self.stack)
        with self._cond:
            if (self._loads or self._stores.num_stores or probing) and not self._results:
                self._cond.wait(timeout)

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- stores (``stores.StorePipeline``) -------------------------------------------------

    def save(self, metadata: ConnectorMetadata) -> None:
        self._stores.save(metadata)

    def wait_for_saves(self, timeout: float | None = None) -> bool:
        return self._stores.wait_for_saves(timeout)

    def inflight_bytes(self) -> int:
        return self._stores.inflight_bytes()

    # -- misc ----------------------------------------------------------------------------

    def take_stats(self) -> OffloadingStats:
        for tier in self.stack:
            counted = tier.take_counters()
            if counted:
                with self._stats.update() as s:
                    for name, value in counted.items():
                        bump(s.tier_counters, name, value)
        return self._stats.take()

    def shutdown(self) -> None:
        """Bounded whatever the storage does: the tiers fail the I/O still outstanding after
        their grace, which frees load threads waiting on it."""
        self._loader.shutdown(wait=False, cancel_futures=True)
        self._stores.shutdown()
        self.stack.shutdown()
        self._loader.shutdown(wait=True)
        self._writer.shutdown()


def _from_memory_only(stack: TierStack, spec: LoadSpec) -> bool:
    """Whether every unit of the load is in a tier without I/O (the CPU tier)."""
    keys = spec.keys
    if not isinstance(keys, OffloadLoadKeys):
        return False
    tiers = [stack.get(u.tier) for u in keys.units]
    return all(t is not None and t.in_memory for t in tiers)

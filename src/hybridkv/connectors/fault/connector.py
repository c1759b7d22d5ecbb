"""``FaultInjection``: wraps any connector and fails, corrupts, delays or times out its loads.

Config (``kv_connector_extra_config``)::

    {"inner": {<the wrapped connector's kv_transfer_config>},
     "block_failure_rate": 0.0, "request_failure_rate": 0.0, "corrupt_rate": 0.0,
     "delay_seconds": 0.0, "load_timeout_seconds": 30.0, "seed": 0}

The scheduler half is the inner one's. The worker half lets the inner load write its bytes, then
decides per load (right after ``start_load`` for sync loads, when the inner reports the request
finished for async ones) what to break. Every decision is a hash of ``(seed, request id, where)``
(``fault_draw``), never of timing or call order, so a run is reproducible. A broken block or
state gets random bytes written over it, so an engine that ignored the report would visibly
produce wrong tokens.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from hybridkv.connectors.base import BaseConnectorWorker, KVConnectorPair
from hybridkv.connectors.config import KVTransferConfig
from hybridkv.connectors.delegating import DelegatingConnectorScheduler, DelegatingConnectorWorker
from hybridkv.connectors.fault.plan import TIMEOUT, FaultConfig, fault_draw, plan_faults
from hybridkv.connectors.outputs import merge_output
from hybridkv.connectors.registry import ConnectorContext, create_connector
from hybridkv.connectors.stats import ConnectorStats, bump, counter
from hybridkv.kv.spec import KVCacheLayout
from hybridkv.step_io import ConnectorMetadata, FailureReason, KVConnectorOutput, LoadSpec


@dataclass(slots=True)
class FaultStats(ConnectorStats):
    """What ``FaultInjection`` broke; the wrapped connector's stats are ``children["inner"]``."""

    injected_failures: dict[FailureReason, int] = counter("injected_failures:{}")
    injected_delay_seconds: float = counter("injected_delay_seconds")


def _wrap(inner: ConnectorStats, own: FaultStats | None = None) -> FaultStats:
    stats = own or FaultStats()
    stats.children["inner"] = inner
    return stats


class FaultInjectionScheduler(DelegatingConnectorScheduler):
    """The inner scheduler half, unchanged; only its stats are wrapped."""

    def take_stats(self) -> FaultStats:
        return _wrap(self.inner.take_stats())


@dataclass(slots=True)
class _HeldLoad:
    """An async load the inner finished (or has in flight) that is not reported yet."""

    spec: LoadSpec
    started: float
    inner_done: bool = False
    inner_output: KVConnectorOutput = field(default_factory=KVConnectorOutput)


class FaultInjectionWorker(DelegatingConnectorWorker):
    """The inner worker half; loads are broken as planned after the inner wrote them."""

    def __init__(self, inner: BaseConnectorWorker, config: FaultConfig, layout: KVCacheLayout):
        super().__init__(inner)
        self.config = config
        self.layout = layout
        self._held: dict[str, _HeldLoad] = {}
        self._ready = KVConnectorOutput()  # sync-load faults, reported by the next get_finished
        self._stats = FaultStats()
        self._sleeper = threading.Event()  # never set: a timed wait that is not a busy loop

    def start_load(self, metadata: ConnectorMetadata) -> None:
        self.inner.start_load(metadata)
        now = time.monotonic()
        for spec in metadata.loads:
            if spec.is_async:
                self._held[spec.request_id] = _HeldLoad(spec, now)
            else:
                merge_output(self._ready, self._inject(spec))

    def get_finished(self, finished_request_ids: list[str]) -> KVConnectorOutput:
        output = self.inner.get_finished(finished_request_ids)
        self._hold_back(output)
        now = time.monotonic()
        for rid, held in list(self._held.items()):
            if held.inner_done and now >= self._due(held):
                del self._held[rid]
                merge_output(output, held.inner_output)
                merge_output(output, self._release(held, now))
        ready, self._ready = self._ready, KVConnectorOutput()
        merge_output(output, ready)
        return output

    def _hold_back(self, output: KVConnectorOutput) -> None:
        """Move what the inner reports about held requests into their records (released later)."""
        for rid, held in self._held.items():
            mine = held.inner_output
            if rid in output.finished_recving:
                output.finished_recving.discard(rid)
                mine.finished_recving.add(rid)
                held.inner_done = True
            if rid in output.failed_recving:
                mine.failed_recving[rid] = output.failed_recving.pop(rid)
            if rid in output.invalid_state:
                mine.invalid_state[rid] = output.invalid_state.pop(rid)
            for block_id in (b for ids in held.spec.block_ids for b in ids):
                if block_id in output.invalid_block_ids:
                    mine.invalid_block_ids[block_id] = output.invalid_block_ids.pop(block_id)

    def _due(self, held: _HeldLoad) -> float:
        wait = min(self.config.delay_seconds, self.config.load_timeout_seconds)
        return held.started + wait

    def _release(self, held: _HeldLoad, now: float) -> KVConnectorOutput:
        if self.config.delay_seconds > self.config.load_timeout_seconds:
            bump(self._stats.injected_failures, TIMEOUT)
            return self._break_request(held.spec, TIMEOUT)
        if self.config.delay_seconds > 0:
            self._stats.injected_delay_seconds += now - held.started
        return self._inject(held.spec)

    def _inject(self, spec: LoadSpec) -> KVConnectorOutput:
        plan = plan_faults(self.config, spec, self.layout.state_group_ids)
        if plan.request_reason is not None:
            bump(self._stats.injected_failures, plan.request_reason)
            return self._break_request(spec, plan.request_reason)
        output = KVConnectorOutput(invalid_block_ids=dict(plan.blocks))
        self._write_garbage(spec, list(plan.blocks), list(plan.states))
        for reason in plan.states.values():
            output.invalid_state.setdefault(spec.request_id, reason)
        for reason in (*plan.blocks.values(), *plan.states.values()):
            bump(self._stats.injected_failures, reason)
        return output

    def _break_request(self, spec: LoadSpec, reason: str) -> KVConnectorOutput:
        block_ids = [b for ids in spec.block_ids for b in ids]
        state_groups = list(self.layout.state_group_ids[: len(spec.state_slots)])
        self._write_garbage(spec, block_ids, state_groups)
        output = KVConnectorOutput(failed_recving={spec.request_id: reason})
        if spec.is_async:
            output.finished_recving.add(spec.request_id)
        return output

    def _write_garbage(self, spec: LoadSpec, block_ids: list[int], state_groups: list[int]) -> None:
        """Random bytes, seeded like the decisions, over the given blocks and live slots."""
        seed = int(fault_draw(self.config.seed, spec.request_id, "garbage") * 2**62)
        generator = torch.Generator().manual_seed(seed)
        if block_ids:
            shape = (len(block_ids), self.layout.group_size, self.layout.layer_page_bytes)
            self.cache.write_blocks(block_ids, _random_bytes(shape, generator))
        slot_of = dict(zip(self.layout.state_group_ids, spec.state_slots, strict=False))
        for gid in state_groups:
            size = self.layout.state_slot_bytes(gid)
            self.cache.write_state(gid, slot_of[gid], _random_bytes((size,), generator))

    def has_pending(self) -> bool:
        return bool(self._held) or not self._ready.is_empty or self.inner.has_pending()

    def wait_for_progress(self, timeout: float) -> None:
        waiting = [h for h in self._held.values() if h.inner_done]
        if waiting:
            timeout = min(timeout, max(0.0, min(self._due(h) for h in waiting) - time.monotonic()))
        if self.inner.has_pending():
            self.inner.wait_for_progress(timeout)
        elif waiting and timeout > 0:
            self._sleeper.wait(timeout)

    def take_stats(self) -> FaultStats:
        stats, self._stats = self._stats, FaultStats()
        return _wrap(self.inner.take_stats(), stats)


def _random_bytes(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)


def create_fault_injection(config: KVTransferConfig, context: ConnectorContext) -> KVConnectorPair:
    faults = config.options_as(FaultConfig)
    inner = create_connector(faults.inner, context)
    worker = FaultInjectionWorker(inner.worker, faults, context.layout)
    return KVConnectorPair(FaultInjectionScheduler(inner.scheduler), worker)

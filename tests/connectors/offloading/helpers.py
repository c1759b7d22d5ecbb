"""Builders for OffloadingConnector unit tests (no model): configs, an engine double that
saves prompts step by step, and accessors for the tiers.

Layouts come from ``tests.connectors.helpers`` (B = 4, sliding window W = 8); units here are
C = 8 tokens (two blocks), so a unit ending at T holds full blocks [T/4 - 2, T/4), sliding
blocks [max(0, T-7)/4, T/4) and the state at T.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridkv.connectors.base import RequestBlocks
from hybridkv.connectors.offloading.scheduler import OffloadingScheduler
from hybridkv.connectors.offloading.tiers.cpu.tier import CpuTier
from hybridkv.connectors.offloading.tiers.disk.tier import DiskTier
from hybridkv.connectors.offloading.worker import OffloadingWorker
from hybridkv.kv.spec import KVCacheLayout
from tests.connectors.helpers import Engine, FakeRequest
from tests.support import configs
from tests.support.stats import flat_counters

C = 8
# hybrid layout: g0 full, g1 sliding, g2 state. An 18-token prompt: units end at 8 and 16.
SRC = {0: [1, 2, 3, 4, 5], 1: [6, 7, 8, 9, 10]}
DST = {0: [11, 12, 13, 14, 15], 1: [0, 0, 16, 17, 18]}


def offload_config(
    cpu: str | int | None = "1MiB",
    disk: Path | None = None,
    remote: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return configs.offload_config(
        cpu, disk, remote, default_disk_bytes="4MiB", **{"chunk_tokens": C, **extra}
    )


class OffloadEngine(Engine):
    def __init__(
        self,
        config: dict[str, Any],
        layout: KVCacheLayout,
        fingerprint: str = "fp-a",
        seed: int = 0,
    ) -> None:
        super().__init__(config, layout, fingerprint, seed)
        if self.sched.disk is not None:  # a loaded test machine: wait for probes' answers
            self.disk.probe_wait = 5.0

    @property
    def sched(self) -> OffloadingScheduler:
        inner: Any = self.scheduler
        while not isinstance(inner, OffloadingScheduler):
            inner = inner.inner
        return inner

    @property
    def offload_worker(self) -> OffloadingWorker:
        inner: Any = self.worker
        while not isinstance(inner, OffloadingWorker):
            inner = inner.inner
        return inner

    @property
    def cpu(self) -> CpuTier:
        assert self.sched.cpu is not None
        return self.sched.cpu

    @property
    def disk(self) -> DiskTier:
        assert self.sched.disk is not None
        return self.sched.disk

    def save_prompt(self, request: FakeRequest, blocks: RequestBlocks, chunks: list[int]) -> None:
        """Compute the prompt in steps ending at ``chunks``; save after each; wait."""
        start = 0
        for end in chunks:
            meta = self.scheduler.build_connector_meta([(request, start, end, blocks)])
            self.worker.save(meta)
            assert self.offload_worker.wait_for_saves(5.0)
            start = end
        if self.sched.disk is not None:
            assert self.disk.drain(5.0)  # deletions queued behind the writes

    def counters(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for half in (self.scheduler, self.worker):
            for name, value in flat_counters(half.take_stats()).items():
                totals[name] = totals.get(name, 0.0) + value
        return totals

    def assert_clean(self) -> None:
        """No pinned or pending units, accounting consistent, nothing in flight."""
        assert not self.offload_worker.has_pending()
        assert self.offload_worker.inflight_bytes() == 0
        for tier in self.sched.stack:
            tier.index.check_accounting()
            assert tier.index.num_pinned() == 0 and tier.index.num_pending() == 0

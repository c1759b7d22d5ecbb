"""One engine step, with a connector's worker half around the forward pass.

out = scheduler.schedule()
scheduled()                    KV events of the scheduling (evictions) published before compute
worker.start_load(meta)        sync loads land here; async ones start
result = runner.execute(out)   forward + sampling
worker.save(meta)              bytes to store are read before the next step
result.kv_connector_output = worker.get_finished(...)
updated = scheduler.update_from_output(out, result)   recovery first, then tokens
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from hybridkv.connectors.base import BaseConnectorWorker
from hybridkv.request import Request
from hybridkv.sched.scheduler import Scheduler
from hybridkv.step_io import RunnerOutput, SchedulerOutput

IDLE_WAIT_SECONDS = 0.05


class Runner(Protocol):
    def execute(self, out: SchedulerOutput) -> RunnerOutput: ...


def run_step(
    scheduler: Scheduler,
    runner: Runner,
    worker: BaseConnectorWorker | None,
    scheduled: Callable[[], None] | None = None,
) -> tuple[SchedulerOutput, RunnerOutput, list[Request]]:
    out = scheduler.schedule()
    if scheduled is not None:
        scheduled()
    meta = out.kv_connector_metadata
    if worker is not None and meta is not None:
        worker.start_load(meta)
    result = runner.execute(out) if (out.requests or out.finished_request_ids) else RunnerOutput()
    if worker is not None:
        if meta is not None:
            worker.save(meta)
        if out.is_empty and worker.has_pending():
            worker.wait_for_progress(IDLE_WAIT_SECONDS)  # nothing to compute: wait for bytes
        result.kv_connector_output = worker.get_finished(out.finished_request_ids)
    return out, result, scheduler.update_from_output(out, result)

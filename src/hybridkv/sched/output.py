"""What the scheduler hands out: the runner's ``SchedulerOutput`` of a step, and its stats.

``build_scheduler_output`` turns a step's slices into plain data (``step_io``): the tokens of
each slice, a copy of each request's block tables (later steps grow the live ones), its live
state slots, and the coordinator's state restores and saves, which it drains (call it once
per step). It keeps ``finished_ids`` as the output's list: the caller starts a new one.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.kv.coordinator import KVCacheCoordinator
from hybridkv.sched.step_plan import StepSlice
from hybridkv.step_io import ScheduledRequest, SchedulerOutput


@dataclass(slots=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    num_preemptions: int
    kv_usage: float
    num_waiting_for_remote_kv: int = 0  # included in num_waiting


def build_scheduler_output(
    kv: KVCacheCoordinator, slices: list[StepSlice], finished_ids: list[str]
) -> SchedulerOutput:
    restores, saves = kv.take_state_copies()
    out = SchedulerOutput(
        state_restores=restores, state_saves=saves, finished_request_ids=finished_ids
    )
    copy_tables, state_slots = kv.copy_block_ids, kv.get_state_slots
    append = out.requests.append
    for s in slices:
        req, start, end = s.request, s.start, s.end
        tokens, num_prompt = req.all_token_ids, req.num_prompt_tokens
        append(
            ScheduledRequest(
                req.request_id,
                tokens[start:end],
                start,
                copy_tables(req.request_id),
                state_slots(req.request_id),
                start == 0,
                end == len(tokens),
                req.sampling_params,
                len(tokens) - num_prompt,
                tokens,
                num_prompt,
            )
        )
    return out

"""Drive a ``ModelRunner`` by hand-built ``SchedulerOutput``s: no scheduler needed.

The driver hands out fresh block ids per attention group and one live state slot per state
group; sliding groups get the null block 0 for table entries wholly before the window of the
step's first query, so reading outside the window would read garbage and fail the test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hybridkv.kv.spec import SlidingWindowSpec
from hybridkv.model.step.runner import ModelRunner
from hybridkv.sampling.params import SamplingParams
from hybridkv.step_io import RunnerOutput, ScheduledRequest, SchedulerOutput, StateCopy

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


@dataclass
class DriverRequest:
    request_id: str
    prompt: list[int]
    params: SamplingParams = GREEDY
    computed: int = 0
    output: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # [n, V] per step, all tokens
    sampled_logits: list[list[float]] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class RunnerDriver:
    def __init__(
        self,
        runner: ModelRunner,
        first_block: int = 1,
        first_slot: int = 0,
        all_logits: bool = True,
    ) -> None:
        """``all_logits`` False: steps run as the engine runs them (``execute``: no logits of
        every token, so the decode program's greedy head may pick the tokens)."""
        self.runner = runner
        self.keeps_all_logits = all_logits
        self.layout = runner.layout
        self.next_block = first_block
        self.next_slot = first_slot
        self.requests: dict[str, DriverRequest] = {}

    def add(
        self, request_id: str, prompt: list[int], params: SamplingParams = GREEDY
    ) -> DriverRequest:
        req = DriverRequest(request_id, list(prompt), params)
        req.tables = [[] for _ in self.layout.attention_group_ids]
        req.slots = [self.take_slot() for _ in self.layout.state_group_ids]
        self.requests[request_id] = req
        return req

    def take_slot(self) -> int:
        self.next_slot += 1
        return self.next_slot - 1

    def step(
        self,
        plan: dict[str, int],
        restores: list[StateCopy] | None = None,
        saves: list[StateCopy] | None = None,
        finished: list[str] | None = None,
        restored: set[str] | None = None,
    ) -> RunnerOutput:
        """Compute ``plan[request_id]`` more tokens of each request (one step)."""
        scheduled = [
            self._schedule(self.requests[rid], n, rid in (restored or set()))
            for rid, n in plan.items()
        ]
        out = SchedulerOutput(scheduled, restores or [], saves or [], finished or [])
        if self.keeps_all_logits:
            result, every = self.runner.execute_with_all_logits(out)
        else:
            result, every = self.runner.execute(out), {}
        for sched in scheduled:
            req = self.requests[sched.request_id]
            req.computed += len(sched.token_ids)
            if sched.request_id in every:
                req.logits.append(every[sched.request_id])
            if sched.request_id in result.sampled_token_ids:
                req.output.append(result.sampled_token_ids[sched.request_id])
            if sched.request_id in result.logits:
                req.sampled_logits.append(result.logits[sched.request_id])
        return result

    def decode_all(self, request_ids: list[str], num_steps: int) -> None:
        for _ in range(num_steps):
            self.step(dict.fromkeys(request_ids, 1))

    def all_logits(self, request_id: str) -> torch.Tensor:
        """Logits ``[computed, V]`` of every position computed so far."""
        return torch.cat(self.requests[request_id].logits)

    def _schedule(self, req: DriverRequest, n: int, restored: bool) -> ScheduledRequest:
        start = req.computed
        tokens = req.tokens[start : start + n]
        assert len(tokens) == n, f"{req.request_id}: only {len(tokens)} tokens to compute"
        end = start + n
        tables = tuple(self._table(req, i, start, end) for i in range(len(req.tables)))
        return ScheduledRequest(
            request_id=req.request_id,
            token_ids=tokens,
            start_pos=start,
            block_ids=tables,
            state_slots=tuple(req.slots),
            reset_state=start == 0 and not restored,
            sample=end >= len(req.tokens),
            sampling_params=req.params,
            num_output_tokens=len(req.output),
        )

    def _table(self, req: DriverRequest, index: int, start: int, end: int) -> list[int]:
        group = self.layout.groups[self.layout.attention_group_ids[index]]
        block_size = self.layout.block_size
        table = req.tables[index]
        while len(table) * block_size < end:
            table.append(self.next_block)
            self.next_block += 1
        if isinstance(group.spec, SlidingWindowSpec):
            first_needed = max(0, start - group.spec.sliding_window + 1) // block_size
            return [0] * first_needed + table[first_needed:]
        return list(table)

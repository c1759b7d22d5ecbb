"""The scheduler: a token budget shared by running requests first, then waiting ones.

There are no prefill and decode phases: each step every scheduled request computes the tokens
``[num_computed_tokens, end)``, where ``end`` is bounded by its token count, the budget, and
(with a KV connector, or when states are not taken from the scan) the next due state
checkpoint. ``schedule()`` reads as its named steps::

    schedule_running   decode / continue prefills; preempt the newest request if blocks run out
    schedule_waiting   admit new and preempted requests (prefix hit first), FCFS; one whose
                       next blocks a running prefill computes waits for them (inflight.py)
    build_output       plain data for the runner: tokens, tables, slots, state copies

The step's plan is ``step_plan.StepPlan``; the output is built in ``output.py``.
"""

from __future__ import annotations

from collections import deque

from hybridkv.config import SchedulerConfig
from hybridkv.kv.coordinator import CacheHit, KVCacheCoordinator
from hybridkv.request import Request, RequestStatus
from hybridkv.sched.inflight import InflightPrefixes
from hybridkv.sched.kv_transfer import KVTransfer
from hybridkv.sched.output import SchedulerStats, build_scheduler_output
from hybridkv.sched.recovery import Action, Recovery, RecoveryPlan
from hybridkv.sched.step_plan import StepPlan, StepSlice
from hybridkv.step_io import RunnerOutput, SchedulerOutput


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        max_model_len: int,
        kv: KVCacheCoordinator,
        transfer: KVTransfer | None = None,
    ) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.kv = kv
        self.transfer = transfer
        self.recovery = Recovery(transfer) if transfer is not None else None
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.ready: deque[Request] = deque()  # external KV landed: admitted before waiting
        self.requests: dict[str, Request] = {}
        self.finished_ids: list[str] = []  # since the last step; the runner drops their state
        self.num_preemptions = 0
        self.inflight = InflightPrefixes(kv.block_size, lands=kv.has_due_checkpoint)

    # -- requests in and out -------------------------------------------------------------

    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        if req.num_tokens >= self.max_model_len:
            raise ValueError(
                f"request {req.request_id}: prompt of {req.num_tokens} tokens does not fit "
                f"max_model_len={self.max_model_len} (room is needed for at least one output token)"
            )
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def finish_request(self, request_id: str, status: RequestStatus) -> None:
        """Finish (stop, abort, fail) a request wherever it is; frees its blocks (or hands
        them to the connector until its transfer completes)."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        for queue in (self.running, self.waiting, self.ready):
            if req in queue:
                queue.remove(req)
        req.status = status
        self.inflight.forget(request_id)
        self.finished_ids.append(request_id)
        if self.transfer is None or self.transfer.release(req):
            self.kv.free(req)

    def _fail(self, req: Request, message: str, client: bool = False) -> None:
        req.error, req.error_is_client = message, client
        self.finish_request(req.request_id, RequestStatus.FINISHED_ERROR)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or (self.transfer is not None and self.transfer.has_pending())

    def stats(self) -> SchedulerStats:
        remote = len(self.transfer.holding) if self.transfer else 0
        loaded = len(self.ready)
        return SchedulerStats(
            len(self.running),
            len(self.waiting) + remote + loaded,
            self.num_preemptions,
            self.kv.usage(),
            remote,
        )

    # -- one step ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        plan = StepPlan(self.config.max_num_batched_tokens)
        preempted = self._schedule_running(plan)
        if not preempted:
            self._schedule_loaded(plan)
            self._schedule_waiting(plan)
        for req, message in self.transfer.take_errors() if self.transfer else ():
            self._fail(req, message)  # the connector raised for it: it alone ends
        out = self._build_output(plan.slices)
        if self.transfer is not None:
            out.kv_connector_metadata = self.transfer.build_meta(
                [(x.request, x.start, x.end) for x in plan.slices], out.state_restores, self.waiting
            )
        return out

    def _num_seated(self) -> int:
        loading = self.transfer.num_loading() if self.transfer else 0
        return len(self.running) + loading + len(self.ready)

    def _step_end(self, req: Request, start: int, budget: int, hit: CacheHit | None = None) -> int:
        """End of the next step: bounded by the tokens, the budget, the next due state
        checkpoint, and within the prompt the connector's save interval."""
        # a connector saves the live state at step ends: it still needs steps split at the
        # due boundaries (the prompt's end among them), as before states came from the scan
        split = self.transfer is not None
        end = self.kv.next_step_end(req, start, min(req.num_tokens, start + budget), hit, split)
        interval = self.transfer.connector.get_step_interval(req) if self.transfer else 0
        if interval and start < req.num_prompt_tokens:
            end = min(end, (start // interval + 1) * interval)
        return end

    def _schedule_running(self, plan: StepPlan) -> bool:
        """Schedule running requests in order; returns whether anything was preempted."""
        preempted = False
        i = 0
        running, allocate = self.running, self.kv.allocate
        # without a connector or due state checkpoints a step ends at the tokens or the budget
        plain = self.transfer is None and not self.kv.splits_steps
        while i < len(running) and plan.tokens_left > 0:
            req = running[i]
            start = req.num_computed_tokens
            if plain:
                end = min(req.num_tokens, start + plan.tokens_left)
            else:
                end = self._step_end(req, start, plan.tokens_left)
            while not allocate(req, end - start):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    return True
            plan.add(req, start, end)
            i += 1
        return preempted

    def _schedule_loaded(self, plan: StepPlan) -> None:
        """Requests whose external KV landed hold blocks: they go before new requests."""
        ready = self.ready
        while ready and plan.tokens_left > 0:
            req = ready[0]
            start = req.num_computed_tokens
            end = self._step_end(req, start, plan.tokens_left)
            if not self.kv.allocate(req, end - start):
                return
            ready.popleft()
            self._start_running(req, start, end, plan)

    def _schedule_waiting(self, plan: StepPlan) -> None:
        later: list[Request] = []  # the connector asked to be asked again next step
        while (
            self.waiting and self._num_seated() < self.config.max_num_seqs and plan.tokens_left > 0
        ):
            req = self.waiting.popleft()
            admitted = self._admit(req, plan)
            if admitted is None:
                later.append(req)
            elif not admitted:
                self.waiting.appendleft(req)
                break  # first come, first served: later requests wait too
        self.waiting.extendleft(reversed(later))

    def _admit(self, req: Request, plan: StepPlan) -> bool | None:
        """Local hit, then the connector's external tokens, then allocation.

        Returns False if the request does not fit, None if it is to be asked again next step
        (the connector is not ready, or a running prefill computes its next blocks)."""
        # prompt logprobs need the logits of every prompt position: no prefix hit (as vLLM)
        skip = req.skip_reading_prefix_cache
        hit = self.kv.no_cache_hit() if skip else self.kv.find_cache_hit(req)
        if not skip and self.inflight.should_wait(req, hit.num_tokens, self.running):
            return None  # a running prefill computes its next blocks: hit them once landed
        num_external, is_async = 0, False
        if self.transfer is not None:
            found = self.transfer.lookup(req, hit.num_tokens)
            if found is None:
                return None
            num_external, is_async = found
        start = hit.num_tokens + num_external
        end = start if is_async else self._step_end(req, start, plan.tokens_left, hit)
        if not self.kv.allocate(req, end - start, hit, num_external):
            return False
        if req.status is RequestStatus.WAITING:
            req.cached_tokens["local"] = hit.num_tokens
        req.num_computed_tokens = start
        if self.transfer is not None:
            self.transfer.after_alloc(req, hit.num_tokens, num_external, is_async)
        if not is_async:
            self._start_running(req, start, end, plan)
        return True

    def _start_running(self, req: Request, start: int, end: int, plan: StepPlan) -> None:
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        plan.add(req, start, end)

    def restart(self, req: Request) -> None:
        """Drop everything the request computed or loaded; it starts over from a fresh lookup."""
        for queue in (self.running, self.ready):
            if req in queue:
                queue.remove(req)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(req)

    def _preempt(self, req: Request) -> None:
        """Free everything; the request recomputes from its (prefix-cached) start later."""
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _build_output(self, slices: list[StepSlice]) -> SchedulerOutput:
        out = build_scheduler_output(self.kv, slices, self.finished_ids)
        self.finished_ids = []
        return out

    # -- after the step ------------------------------------------------------------------

    def update_from_output(self, out: SchedulerOutput, result: RunnerOutput) -> list[Request]:
        """Advance computed counts, publish final KV, append sampled tokens, finish stops.

        Returns the requests that got a new token (finished ones included)."""
        discarded = self._recover(result)
        updated: list[Request] = []
        requests, errors, sampled = self.requests, result.errors, result.sampled_token_ids
        cache, running = self.kv.cache, RequestStatus.RUNNING
        for s in out.requests:
            request_id = s.request_id
            req = requests.get(request_id)
            if req is None or req.status is not running or request_id in discarded:
                continue  # finished (aborted) while the step ran, or its KV failed to load
            if errors and request_id in errors:  # its KV of this step is not cached either
                self._fail(req, errors[request_id], request_id in result.client_errors)
                updated.append(req)
                continue
            req.num_computed_tokens = s.start_pos + len(s.token_ids)
            cache(req, req.num_computed_tokens)
            token = sampled.get(request_id) if s.sample else None
            if token is None:
                continue
            req.append_output_token(token)
            updated.append(req)
            status = req.check_stop(self.max_model_len)
            if status is not None:
                self.finish_request(request_id, status)
        self.kv.end_step()
        return updated

    def _recover(self, result: RunnerOutput) -> set[str]:
        """Apply the recovery plan for the worker's report; the step outputs to discard."""
        if self.recovery is None or self.transfer is None:
            return set()
        candidates = self.running + self.transfer.loading() + list(self.ready)
        plan = self.recovery.apply(result.kv_connector_output, self.requests, candidates)
        self._apply(plan)
        return plan.discarded

    def _apply(self, plan: RecoveryPlan) -> None:
        for move in plan.moves:
            req = move.request
            if move.action is Action.FAIL:
                req.error = move.message
                self.finish_request(req.request_id, RequestStatus.FINISHED_ERROR)
            elif move.action is Action.RESTART:
                self.restart(req)
            elif move.action is Action.RESUME:
                req.num_computed_tokens = move.token
                self.kv.rollback(req, move.token)
            elif move.action is Action.FREE:
                self.kv.free(req)
            else:  # READY
                if move.cache:
                    self.kv.cache(req, req.num_computed_tokens)
                req.status = RequestStatus.WAITING
                self.ready.append(req)

"""Recovery from failed, late or corrupted KV loads: never a wrong token.

``Recovery.apply`` reads the worker's report at the start of ``update_from_output`` and returns
a ``RecoveryPlan``: the step outputs to discard and, in order, what the scheduler must do to
which request (it owns the queues and applies the plan):

- a request whose trusted KV touches a failure (its own load, or an invalid block it holds as
  computed) has this step's output discarded;
- policy ``fail``: it finishes with reason ``error`` and a message saying why (``FAIL``);
- policy ``recompute``: a full-attention-only request resumes in place at its first bad token
  (``RESUME``: any prefix is a valid resume point there); a hybrid restarts from a fresh local
  lookup (``RESTART``), which lands on the last restore boundary still intact in every group
  (or 0); it never loads externally again;
- an asynchronous load is only acted on once the worker reports it finished (its background
  writes may still be landing until then): then ``READY`` (admit it first; ``cache``: its
  verified blocks become hits), or a failure as above; one aborted meanwhile is ``FREE``-d, as
  is a request whose delayed send completed.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from hybridkv.connectors.config import LoadFailurePolicy
from hybridkv.request import Request
from hybridkv.sched.kv_transfer import Failure, KVTransfer
from hybridkv.step_io import FailureReason, KVConnectorOutput

log = logging.getLogger(__name__)


class Action(Enum):
    FAIL = "fail"  # finish with FINISHED_ERROR and ``message``
    RESTART = "restart"  # drop its KV; wait (first in line) for a fresh local lookup
    RESUME = "resume"  # keep its KV below ``token``; compute again from there
    FREE = "free"  # free its blocks (it finished while a transfer ran)
    READY = "ready"  # its load completed: admit before new requests (``cache``: publish it)


@dataclass(frozen=True, slots=True)
class Move:
    action: Action
    request: Request
    token: int = 0
    message: str = ""
    cache: bool = False


@dataclass(slots=True)
class RecoveryPlan:
    discarded: set[str] = field(default_factory=set)  # request ids whose step output is void
    moves: list[Move] = field(default_factory=list)  # applied in order


class Recovery:
    def __init__(self, transfer: KVTransfer) -> None:
        self.transfer = transfer
        self._reasons: Counter[str] = Counter()  # this report's failures by reason (for the log)

    def apply(
        self, out: KVConnectorOutput | None, live: Mapping[str, Request], candidates: list[Request]
    ) -> RecoveryPlan:
        """Digest the worker's report. ``live``: unfinished requests by id; ``candidates``:
        those holding KV the report may invalidate (running, loading, loaded)."""
        plan = RecoveryPlan()
        if out is None:
            return plan
        t = self.transfer
        tokens_before = t.stats.recomputed_tokens
        self._reasons = Counter()
        t.connector.update_connector_output(out)
        for rid, failure in t.find_failures(out, candidates).items():
            req = live.get(rid)
            if req is None:
                continue
            if t.is_loading(rid):
                t.defer_failure(rid, failure)
                continue
            plan.discarded.add(rid)
            plan.moves.append(self.recover(req, failure))
        for req in t.take_finished_loads(out):
            plan.moves += self._load_done(req)
        plan.moves += [Move(Action.FREE, req) for req in t.take_finished_sends(out)]
        self._log(plan, t.stats.recomputed_tokens - tokens_before)
        return plan

    def _log(self, plan: RecoveryPlan, tokens: int) -> None:
        """One line per step that recovered (vLLM's operators grep for these)."""
        if not self._reasons:
            return
        failed = sum(1 for m in plan.moves if m.action is Action.FAIL)
        recovered = sum(self._reasons.values()) - failed
        why = ", ".join(f"{reason} x{n}" for reason, n in sorted(self._reasons.items()))
        if recovered:
            log.warning("Recovered from KV load failure: %d request(s) rescheduled (%d tokens to recompute; %s)", recovered, tokens, why)  # fmt: skip
        if failed:
            log.warning("Failing %d request(s) after a KV load failure (kv_load_failure_policy=fail; %s)", failed, why)  # fmt: skip

    def recover(self, req: Request, failure: Failure) -> Move:
        t = self.transfer
        t.stats.failed_requests += 1
        self._reasons[FailureReason.head(failure.reason)] += 1
        if t.policy is LoadFailurePolicy.FAIL:
            message = (
                f"loading KV from the connector failed ({failure.reason}); "
                "kv_load_failure_policy is 'fail'"
            )
            return Move(Action.FAIL, req, message=message)
        for source in [s for s in req.cached_tokens if s != "local"]:
            del req.cached_tokens[source]  # those tokens were not served after all
        t.no_external.add(req.request_id)
        resume = t.resume_point(req, failure, req.num_computed_tokens)
        t.stats.recomputed_tokens += req.num_computed_tokens - (resume or 0)
        if resume is None:
            return Move(Action.RESTART, req)
        return Move(Action.RESUME, req, token=resume)

    def _load_done(self, req: Request) -> list[Move]:
        """An async load completed: publish what it verified, or recover; then admit first."""
        t = self.transfer
        if req.status.is_finished:  # aborted while its bytes were landing
            t.forget(req.request_id)
            return [Move(Action.FREE, req)]
        failure = t.take_deferred_failure(req.request_id)
        if failure is None:
            return [Move(Action.READY, req, cache=True)]
        move = self.recover(req, failure)
        return [move, Move(Action.READY, req)] if move.action is Action.RESUME else [move]

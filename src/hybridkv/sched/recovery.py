"""Recovery from failed, late or corrupted KV loads: never a wrong token.

Applied at the start of ``update_from_output``, before any request's step output is used:

- a request whose trusted KV touches a failure (its own load, or an invalid block it holds as
  computed) has this step's output discarded;
- policy ``fail``: it finishes with reason ``error`` and a message saying why;
- policy ``recompute``: a full-attention-only request resumes in place at its first bad token
  (any prefix is a valid resume point there); a hybrid restarts from a fresh local lookup, which
  lands on the last restore boundary still intact in every group (or 0); it never loads
  externally again;
- an asynchronous load is only acted on once the worker reports it finished (its background
  writes may still be landing until then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridkv.connectors.config import LoadFailurePolicy
from hybridkv.request import Request, RequestStatus
from hybridkv.sched.kv_transfer import Failure, KVTransfer
from hybridkv.step_io import KVConnectorOutput

if TYPE_CHECKING:
    from hybridkv.sched.scheduler import Scheduler


class Recovery:
    def __init__(self, scheduler: Scheduler, transfer: KVTransfer) -> None:
        self.sched = scheduler
        self.transfer = transfer

    def apply(self, out: KVConnectorOutput | None) -> set[str]:
        """Digest the worker's report; returns the ids whose step output must be discarded."""
        if out is None:
            return set()
        t = self.transfer
        t.connector.update_connector_output(out)
        candidates = self.sched.running + list(t.holding.values()) + list(t.ready)
        discarded: set[str] = set()
        for rid, failure in t.find_failures(out, candidates).items():
            req = self.sched.requests.get(rid)
            if req is None:
                continue
            if rid in t.holding:
                t.failed[rid] = _earliest(t.failed.get(rid), failure)
                continue
            discarded.add(rid)
            self.recover(req, failure)
        for req in t.take_finished_loads(out):
            self._load_done(req)
        for req in t.take_finished_sends(out):
            self.sched.kv.free(req)
        return discarded

    def recover(self, req: Request, failure: Failure) -> None:
        t = self.transfer
        t.stats.failed_requests += 1
        if t.policy is LoadFailurePolicy.FAIL:
            req.error = (
                f"loading KV from the connector failed ({failure.reason}); "
                "kv_load_failure_policy is 'fail'"
            )
            self.sched.finish_request(req.request_id, RequestStatus.FINISHED_ERROR)
            return
        for source in [s for s in req.cached_tokens if s != "local"]:
            del req.cached_tokens[source]  # those tokens were not served after all
        t.no_external.add(req.request_id)
        resume = t.resume_point(req, failure, req.num_computed_tokens)
        t.stats.recomputed_tokens += req.num_computed_tokens - (resume or 0)
        if resume is not None:
            req.num_computed_tokens = resume
            self.sched.kv.rollback(req, resume)
        else:
            self.sched.restart(req)

    def _load_done(self, req: Request) -> None:
        """An async load completed: cache what it verified, or recover; then admit first."""
        t = self.transfer
        rid = req.request_id
        if req.status.is_finished:  # aborted while its bytes were landing
            self.sched.kv.free(req)
            t.forget(rid)
            return
        req.status = RequestStatus.WAITING
        failure = t.failed.pop(rid, None)
        if failure is not None:
            self.recover(req, failure)
            if req.status.is_finished or not self.sched.kv.has_request(rid):
                return
        else:
            self.sched.kv.cache(req, req.num_computed_tokens)
        t.ready.append(req)


def _earliest(old: Failure | None, new: Failure) -> Failure:
    if old is None:
        return new
    if old.first_bad_token is None or new.first_bad_token is None:
        return Failure(old.reason, None)
    return old if old.first_bad_token <= new.first_bad_token else new

"""The scheduler's side of a KV connector: lookups, asynchronous-load waits, delayed frees.

A request's tokens at admission::

    | local hit (L) | external (n) | new tokens ... |
    0               L              L+n = num_computed_tokens at allocation

A synchronous load is written before this step's forward pass; an asynchronous one parks the
request in ``holding`` (WAITING_FOR_REMOTE_KVS) with its blocks allocated and unhashed until
the worker reports it in ``finished_recving``; only then are its blocks cached (after the
failure report of the same output has been applied).

Every call into the connector about one request (lookup, finish, drop) is guarded: an exception
there fails that request alone (``take_errors``: the scheduler finishes it with the error) or,
once it finished, is logged; ``on_waiting`` errors are logged. An exception anywhere else in a
step cannot be pinned on one request (the scheduler's and the runner's views may disagree
half-way through a step), so it stops the engine, whose health then says so.

``KVTransfer`` keeps only the connector's side of requests (loads in flight, failures waiting
for their load to finish, delayed frees); it never touches the scheduler's queues or frees
blocks itself: ``release`` says whether the scheduler frees them now, and ``Recovery`` turns
finished transfers into a plan the scheduler applies.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

from hybridkv.connectors.base import BaseConnectorScheduler, KVConnectorRequest, RequestBlocks
from hybridkv.connectors.config import LoadFailurePolicy
from hybridkv.kv.coordinator import KVCacheCoordinator
from hybridkv.kv.state_manager import StateCopy
from hybridkv.request import Request, RequestStatus
from hybridkv.sampling.transfer_params import TransferFields
from hybridkv.step_io import ConnectorMetadata, FailureReason, KVConnectorOutput

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RefusedRequest:
    """A request refused before the scheduler held it, as ``request_dropped`` sees it (no
    tokens: a connector only releases what it holds for these params)."""

    request_id: str
    transfer_fields: TransferFields


@dataclass(slots=True)
class TransferStats:
    load_failures: dict[FailureReason, int] = field(default_factory=dict)  # by reason
    recomputed_tokens: int = 0
    failed_requests: int = 0
    external_tokens: int = 0  # tokens admitted as external hits


@dataclass(slots=True)
class Failure:
    reason: str
    first_bad_token: int | None  # None: the whole external range is suspect


class KVTransfer:
    def __init__(
        self,
        connector: BaseConnectorScheduler,
        policy: LoadFailurePolicy,
        kv: KVCacheCoordinator,
    ) -> None:
        self.connector = connector
        caps = connector.capabilities()  # the optional hook groups, once
        self.leases, self.partial = caps.leases, caps.partial
        self.policy = policy
        self.kv = kv
        self.holding: dict[str, Request] = {}
        self.failed: dict[str, Failure] = {}  # async loads that failed, awaiting completion
        self.aborted: dict[str, Request] = {}  # aborted while loading: free on completion
        self.delayed_free: dict[str, Request] = {}
        self.load_start: dict[str, int] = {}  # request id -> first external token
        self.no_external: set[str] = set()  # requests that must not load again
        self.stats = TransferStats()
        self._told_waiting = False  # the connector's last on_waiting list was not empty
        self._errors: dict[str, tuple[Request, str]] = {}  # the connector raised for these
        self._num_refused = 0

    def blocks_of(self, req: Request) -> RequestBlocks:
        return RequestBlocks(
            self.kv.get_block_ids(req.request_id), self.kv.get_state_slots(req.request_id)
        )

    # -- admission -----------------------------------------------------------------------

    def lookup(self, req: Request, num_local: int) -> tuple[int, bool] | None:
        """External tokens beyond the local hit and whether the load is async; None = later."""
        if req.request_id in self.no_external or req.skip_reading_prefix_cache:
            return 0, False
        if req.request_id in self._errors:
            return None
        try:
            found = self.connector.get_num_new_matched_tokens(req, num_local)
        except Exception as exc:  # noqa: BLE001 - that request fails, the engine runs on
            self._errors[req.request_id] = (req, self._failed_call(req.request_id, exc))
            return None
        if found is None:
            return None
        num_external = self._clamp(req, num_local, found[0])
        return num_external, found[1] and num_external > 0

    def _clamp(self, req: Request, num_local: int, num_external: int) -> int:
        """At most N-1 tokens come from outside (the last one is computed for its logits).
        A state cannot be rewound, so a state layout rejects a longer hit."""
        limit = max(0, req.num_tokens - 1 - num_local)
        if num_external <= limit:
            return num_external
        if self.kv.state:
            self._count(FailureReason.REJECTED_PAST_LAST_TOKEN)
            return 0
        return limit

    def after_alloc(self, req: Request, num_local: int, num_external: int, is_async: bool) -> None:
        self.connector.update_state_after_alloc(req, self.blocks_of(req), num_external)
        if num_external == 0:
            return
        whole = self.partial.get_first_whole_blocks(req, num_external) if self.partial else None
        if whole is not None:  # entries before these get partial bytes: never hashed
            self.kv.skip_caching(req, whole)
        self.stats.external_tokens += num_external
        self.load_start[req.request_id] = num_local
        if req.status is RequestStatus.WAITING:  # first admission: count by source once
            for source, n in self.connector.get_hit_sources(req, num_external).items():
                req.cached_tokens[source] = req.cached_tokens.get(source, 0) + n
        if is_async:
            req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            self.holding[req.request_id] = req

    def build_meta(
        self,
        scheduled: list[tuple[Request, int, int]],
        restores: list[StateCopy],
        waiting: Iterable[Request] = (),
    ) -> ConnectorMetadata:
        """The connector's metadata for this step; ``restores`` (this step's checkpoint
        restores) tell it which checkpoint a request's live state starts from; ``waiting``
        (the queue after this step's admissions) which requests with params still wait."""
        self._note_waiting(waiting)
        source = {(c.group_id, c.dst_slot): c.src_slot for c in restores}
        items = []
        for req, start, end in scheduled:
            blocks = self.blocks_of(req)
            keys = list(zip(self.kv.layout.state_group_ids, blocks.state_slots, strict=True))
            if keys and all(k in source for k in keys):
                restored = tuple(source[k] for k in keys)
                blocks = RequestBlocks(blocks.block_ids, blocks.state_slots, restored)
            items.append((req, start, end, blocks))
        return self.connector.build_connector_meta(items)  # type: ignore[arg-type]

    def _note_waiting(self, waiting: Iterable[Request]) -> None:
        """``on_waiting`` with the waiting requests that carry params; skipped while there are
        none (after one empty call that ends the previous list)."""
        found = [req for req in waiting if req.transfer_fields is not None]
        if self.leases is not None and (found or self._told_waiting):
            self._guarded("", functools.partial(self.leases.on_waiting, found))
        self._told_waiting = bool(found)

    def take_errors(self) -> list[tuple[Request, str]]:
        """Requests the connector raised for (each with a message), to fail; drains."""
        errors, self._errors = list(self._errors.values()), {}
        return errors

    def drop_refused(self, params: TransferFields) -> None:
        """A request carrying ``params`` was refused before the scheduler held it (a bad
        field, overload): ``request_dropped`` lets a producer free its KV now, not after its
        lease."""
        if self.leases is not None:
            self._num_refused += 1
            stub = cast(KVConnectorRequest, RefusedRequest(f"refused-{self._num_refused}", params))
            self._guarded(stub.request_id, functools.partial(self.leases.request_dropped, stub))

    def _guarded(self, request_id: str, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - logged; the request is gone anyway
            self._failed_call(request_id, exc)

    @staticmethod
    def _failed_call(request_id: str, exc: Exception) -> str:
        log.exception("KV connector failed for request %s", request_id or "(several)")
        return f"kv connector error: {type(exc).__name__}: {exc}"

    # -- after the step ------------------------------------------------------------------

    def find_failures(
        self, out: KVConnectorOutput, candidates: list[Request]
    ) -> dict[str, Failure]:
        """Every request whose trusted KV touches a failed load: the loads' owners and any
        other request holding an invalid block as computed. Invalid blocks leave the prefix
        map at once."""
        for reason in (
            list(out.failed_recving.values())
            + list(out.invalid_state.values())
            + list(out.invalid_block_ids.values())
        ):
            self._count(reason)
        failures = {rid: Failure(reason, None) for rid, reason in out.failed_recving.items()}
        for rid, reason in out.invalid_state.items():
            failures.setdefault(rid, Failure(reason, None))
        bad = set(out.invalid_block_ids)
        if not bad:
            return failures
        self.kv.evict_blocks(bad)
        for req in candidates:
            k = self.kv.first_block_index_in(req.request_id, bad, req.num_computed_tokens)
            if k is not None and req.request_id not in failures:
                table_block = next(
                    b
                    for t in self.kv.get_block_ids(req.request_id)
                    for b in t[k : k + 1]
                    if b in bad
                )
                failures[req.request_id] = Failure(
                    out.invalid_block_ids[table_block], k * self.kv.block_size
                )
        return failures

    def resume_point(self, req: Request, failure: Failure, computed: int) -> int | None:
        """Where a full-attention-only request resumes in place; None: start over (hybrids)."""
        if not self.kv.is_full_attention_only:
            return None
        start = self.load_start.get(req.request_id, 0)
        bad = failure.first_bad_token if failure.first_bad_token is not None else start
        return min(bad, computed)

    def is_loading(self, request_id: str) -> bool:
        return request_id in self.holding

    def num_loading(self) -> int:
        return len(self.holding)

    def loading(self) -> list[Request]:
        """Requests waiting for their async load (WAITING_FOR_REMOTE_KVS), oldest first."""
        return list(self.holding.values())

    def defer_failure(self, request_id: str, failure: Failure) -> None:
        """A failure of a load still in flight: acted on once the load reports finished."""
        self.failed[request_id] = _earliest(self.failed.get(request_id), failure)

    def take_deferred_failure(self, request_id: str) -> Failure | None:
        return self.failed.pop(request_id, None)

    def take_finished_loads(self, out: KVConnectorOutput) -> list[Request]:
        """Requests whose async load completed (successfully or not) this step."""
        done = []
        for rid in out.finished_recving:
            req = self.holding.pop(rid, None) or self.aborted.pop(rid, None)
            if req is not None:
                done.append(req)
        return done

    def take_finished_sends(self, out: KVConnectorOutput) -> list[Request]:
        return [
            self.delayed_free.pop(rid) for rid in out.finished_sending if rid in self.delayed_free
        ]

    def release(self, req: Request) -> bool:
        """A request finished: tell the connector (exactly once; ``request_dropped`` if it held
        no KV). True: the scheduler frees its
        blocks now; else they are freed when its in-flight load completes, or when the
        connector reports the send done (``Recovery`` plans a ``FREE`` then)."""
        rid = req.request_id
        self._errors.pop(rid, None)
        if not self.kv.has_request(rid):
            if req.transfer_fields is not None and self.leases is not None:
                self._guarded(rid, functools.partial(self.leases.request_dropped, req))
            self.forget(rid)
            return False
        try:
            delay, params = self.connector.request_finished(req, self.blocks_of(req))
            kept = self.partial.get_kept_kv(req) if delay and self.partial else None  # its params
        except Exception as exc:  # noqa: BLE001 - freed now; nothing is handed out
            delay, params, kept = False, None, None
            self._failed_call(rid, exc)
        req.kv_transfer_params = params
        if rid in self.holding:
            self.aborted[rid] = self.holding.pop(rid)
            return False
        if delay:
            self.delayed_free[rid] = req
            if kept is not None:
                self.kv.keep_for_transfer(req, kept.num_tokens, kept.window_at)
        self.forget(rid)
        return not delay

    def forget(self, request_id: str) -> None:
        self.load_start.pop(request_id, None)
        self.no_external.discard(request_id)
        self.failed.pop(request_id, None)

    def has_pending(self) -> bool:
        return (
            bool(self.holding or self.aborted or self.delayed_free) or self.connector.has_pending()
        )

    def _count(self, reason: str | FailureReason) -> None:
        key = FailureReason.of(reason)
        self.stats.load_failures[key] = self.stats.load_failures.get(key, 0) + 1


def _earliest(old: Failure | None, new: Failure) -> Failure:
    if old is None:
        return new
    if old.first_bad_token is None or new.first_bad_token is None:
        return Failure(old.reason, None)
    return old if old.first_bad_token <= new.first_bad_token else new

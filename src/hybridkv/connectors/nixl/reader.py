"""A consumer's loads: handshake (cached per producer), descriptor plan, the data READ, then
the lease check, after which the producer is notified.

    handshake -> READ data -> READ the lease word -> ``lease_valid``? finished, and notify the
    producer (``"<remote request id>:<bytes>"``, it frees) : failed (lease expired)

Reads carry no notification: a READ with one is reported DONE only once the notification went
out through UCX's progress thread (milliseconds on a busy host), while a same-host READ without
one usually completes inside its post. The notification (``send_notif``: a message over UCX's
active-message transport, 10-70 µs here) only lets the producer free, so it waits for the
engine step after the one that reported the load (``end_step``, called from the worker's
``get_finished``): it then goes out after that step's forward, which already uses the loaded
KV, instead of before it. ``has_pending`` covers it, so an idle engine still sends it (within
two idle waits); if the engine stops first, the producer's lease frees.

The params were verified (signed by a producer of this deployment) before a load is built;
the reader still checks every remote index against the producer's descriptor (block ids,
staging entry, lease slot) before planning: a plan that cannot be made fails that load alone
(``nixl_params_malformed``) and never forgets the producer, which other loads share (only a
transfer error does). The lease check is exact: the word must read the lease's generation; an
older value means the producer's worker has not started the lease yet (the KV is held since
the request ended), so the word is read again at the next progress call.

A refused connection, an incompatible layout, a transfer error, an expired lease or
``load_timeout_seconds`` fail the load with ``"<reason>: <what happened, in words>"``; the
scheduler's recovery recomputes (or fails the request under policy ``fail``, with that text).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from hybridkv.connectors.nixl.agent import NixlAgent, XferState
from hybridkv.connectors.nixl.handshake import HandshakeFailed, Peer, Peers, check_indices
from hybridkv.connectors.nixl.layout import LayoutDescriptor
from hybridkv.connectors.nixl.leases import lease_pending, lease_valid
from hybridkv.connectors.nixl.meta import NotifyOnly, ParamsRefused, RemoteSource
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.plan import Rows, load_rows, total_bytes
from hybridkv.connectors.nixl.stats import Flow, NixlStats
from hybridkv.connectors.outputs import LoadResult
from hybridkv.connectors.stats import StatsCounter, bump
from hybridkv.step_io import LoadSpec

log = logging.getLogger(__name__)

SCRATCH_WORDS = 1024  # lease checks in flight at once


@dataclass(slots=True)
class _Load:
    spec: LoadSpec
    source: RemoteSource
    started: float
    handle: Any = None
    peer: Peer | None = None
    checking: int = -1  # scratch word of the lease check in flight (-1: data read)
    nbytes: int = 0
    num_descs: int = 0

    @property
    def where(self) -> str:
        return f"{self.source.host}:{self.source.port}"


class Reader:
    def __init__(
        self,
        options: NixlOptions,
        agent: NixlAgent,
        peers: Peers,
        local: LayoutDescriptor,
        stats: StatsCounter[NixlStats],
        scratch: torch.Tensor,
    ) -> None:
        self.options, self.agent, self.peers, self.local = options, agent, peers, local
        self.stats = stats
        self.scratch = scratch.numpy().view("uint64")
        base = scratch.data_ptr()
        self._scratch_list = agent.prepare(None, [(base + 8 * i, 8) for i in range(len(self.scratch))])  # fmt: skip
        self._attn = [i for i, g in enumerate(local.groups) if g.token_bytes]
        self._free_scratch = list(range(len(self.scratch)))
        self.loads: list[_Load] = []
        self.notify: list[NotifyOnly] = []
        self.done: list[LoadResult] = []
        # (producer agent, message) of finished loads: queued this step, due at the next one
        self._notify_queued: list[tuple[str, bytes]] = []
        self._notify_due: list[tuple[str, bytes]] = []
        self.last_notify = float("-inf")  # when a NotifyOnly (maybe no READ before) was sent

    def close(self) -> None:
        """At shutdown, before the agent closes: release the reads in flight (NIXL aborts
        them) and the prepared scratch list."""
        for load in self.loads:
            if load.handle is not None:
                self.agent.release(load.handle)
                load.handle = None
        self.agent.release_prepared(self._scratch_list)

    def add(self, spec: LoadSpec, now: float) -> None:
        assert isinstance(spec.keys, RemoteSource)
        self.loads.append(_Load(spec, spec.keys, now))

    def has_pending(self) -> bool:
        return bool(self.loads or self.notify or self._notify_queued or self._notify_due)

    def progress(self) -> bool:
        """Advance every load (handshake, post, poll, check) and notification; True if any
        ended."""
        before = len(self.done)
        for load in list(self.loads):
            self._advance(load)
        self._send_notifications()
        return len(self.done) > before

    def end_step(self) -> int:
        """Once per engine step, after its results were taken: notify the producers of the
        loads reported in an earlier step (their KV has been used by a forward since) and
        hold this step's for the next call. Returns how many were sent."""
        due, self._notify_due, self._notify_queued = self._notify_due, self._notify_queued, []
        for agent_name, message in due:
            try:
                self.agent.notify(agent_name, message)
            except Exception as exc:  # noqa: BLE001 - the producer's lease frees instead
                log.warning("NIXL: notifying producer %s failed: %s", agent_name, exc)
        return len(due)

    def _advance(self, load: _Load) -> None:
        try:
            while load in self.loads and self._step(load):
                pass  # a read on the same host often completes inside its post
            if load in self.loads and time.monotonic() - load.started > self.options.load_timeout_seconds:  # fmt: skip
                self._fail(
                    load,
                    "nixl_timeout",
                    f"no data from the producer at {load.where} after "
                    f"{self.options.load_timeout_seconds}s (load_timeout_seconds)",
                )
        except HandshakeFailed as exc:
            self._fail(load, exc.reason, str(exc))
        except ParamsRefused as exc:  # this request's params: the peer stays
            self._fail(load, exc.reason, str(exc))
        except Exception as exc:  # noqa: BLE001 - NIXL/UCX raise their own error types
            self.peers.forget(load.source)
            self._fail(load, "nixl_transfer_failed", self._transfer_error(load, exc))

    def _step(self, load: _Load) -> bool:
        """One move of a load; False while it waits (handshake, transfer, scratch word)."""
        if load.peer is None:
            load.peer = self.peers.get(load.source)
            if load.peer is None:
                return False
            return self._post(load, load.peer)
        if load.handle is not None:
            return self._poll(load)
        return self._check(load, load.peer)

    @staticmethod
    def _transfer_error(load: _Load, exc: BaseException | None) -> str:
        cause = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
        return (
            f"reading request {load.source.request_id}'s KV from the producer at {load.where} "
            f"failed{cause}; did the prefill engine stop?"
        )

    def _post(self, load: _Load, peer: Peer) -> bool:
        """Plan and post the data READ; True if the load moved on (ended, or its read is
        done: a same-host read often completes inside its post)."""
        check_indices(load.source, peer.descriptor)
        try:
            rows = self._plan(load.spec, load.source, peer.descriptor)
        except (ValueError, IndexError) as exc:
            raise ParamsRefused("nixl_params_malformed", f"no read plan: {exc}") from None
        load.nbytes = total_bytes(rows)
        load.num_descs = len(rows)
        if not load.num_descs:
            self._notify_queued.append((peer.agent_name, self._notification(load)))
            self._succeed(load)
            return True
        load.handle, state = self.agent.read(peer.agent_name, rows, b"")
        return state is not XferState.PROC and self._ended(load, state)

    def _notification(self, load: _Load) -> bytes:
        return f"{load.source.request_id}:{load.nbytes}".encode()

    def _check(self, load: _Load, peer: Peer) -> bool:
        """Read the lease's word after the data (see ``leases``); True if the load moved on."""
        if not self._free_scratch:
            return False  # a later progress call posts it
        lease = load.source.lease
        assert lease is not None  # required by RemoteSource.parse when there is data
        load.checking = self._free_scratch.pop()
        self.scratch[load.checking] = 0
        load.handle, state = self.agent.read_prepared(
            self._scratch_list, load.checking, peer.leases, lease.slot
        )
        return state is not XferState.PROC and self._ended(load, state)

    def _poll(self, load: _Load) -> bool:
        state = self.agent.state(load.handle)
        return state is not XferState.PROC and self._ended(load, state)

    def _ended(self, load: _Load, state: XferState) -> bool:
        """The READ in flight ended in ``state``: fail, check the lease, or judge. True."""
        handle, load.handle = load.handle, None
        self.agent.release(handle)
        if state is not XferState.DONE:
            self.peers.forget(load.source)
            self._fail(load, "nixl_transfer_failed", self._transfer_error(load, None))
        elif load.checking < 0:
            assert load.peer is not None
            self._check(load, load.peer)
        else:
            return self._verdict(load)
        return True

    def _verdict(self, load: _Load) -> bool:
        """Judge the lease word; True if the load ended, False if the word is read again at
        the next progress call (the lease has not started on the producer's worker yet)."""
        lease = load.source.lease
        assert lease is not None
        word = int(self.scratch[load.checking])
        if lease_valid(word, lease.gen):
            assert load.peer is not None
            self._notify_queued.append((load.peer.agent_name, self._notification(load)))
            self._succeed(load)
            return True
        if lease_pending(word, lease.gen):
            self._free_scratch.append(load.checking)
            load.checking = -1
            return False
        self._fail(
            load,
            "nixl_lease_expired",
            f"the producer at {load.where} no longer held request {load.source.request_id}'s "
            f"KV when this read completed: its lease had ended, because another request "
            f"already read the same kv_transfer_params (each serves one read: send them to "
            f"one decode request), or because the read started later than the producer's "
            f"abort_timeout_seconds after its prefill (raise it on the prefill engine if "
            f"requests wait here that long)",
        )
        return True

    def _plan(self, spec: LoadSpec, src: RemoteSource, remote: LayoutDescriptor) -> Rows:
        """Rows (local address, remote address, bytes) of every group's read and the state.
        Params that contradict the producer's layout fail this load alone (the peer stays)."""
        try:
            return load_rows(self.local, remote, spec, src)
        except ValueError as exc:
            raise HandshakeFailed("nixl_transfer_failed", f"kv_transfer_params: {exc}") from None

    def _end(self, load: _Load) -> None:
        if load.checking >= 0:
            self._free_scratch.append(load.checking)
            load.checking = -1
        if load in self.loads:
            self.loads.remove(load)

    def _succeed(self, load: _Load) -> None:
        self._end(load)
        with self.stats.update() as s:
            bump(s.nbytes, Flow.LOAD, load.nbytes)
            bump(s.seconds, Flow.LOAD, time.monotonic() - load.started)
            s.descriptors += load.num_descs
            bump(s.transfers, Flow.LOAD)
        self.done.append(LoadResult(load.spec.request_id, True))

    def _fail(self, load: _Load, reason: str, message: str) -> None:
        if load.handle is not None and not self.agent.release(load.handle):
            log.error("NIXL: a failed read's handle could not be released; DMA may still run")
        load.handle = None
        self._end(load)
        log.warning("NIXL load of request %s failed: %s: %s", load.spec.request_id, reason, message)  # fmt: skip
        with self.stats.update() as s:
            bump(s.failures, reason)
        result = LoadResult(load.spec.request_id, True, request_reason=f"{reason}: {message}")
        self.done.append(result)

    def _send_notifications(self) -> None:
        for item in list(self.notify):
            try:
                peer = self.peers.get(item.source)
                if peer is None:
                    continue  # its handshake runs
                self.agent.notify(peer.agent_name, f"{item.source.request_id}:0".encode())
                self.last_notify = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - that producer's lease frees it instead
                log.warning("NIXL: no notification to %s:%d: %s", item.source.host,
                            item.source.port, exc)  # fmt: skip
            self.notify.remove(item)

"""Lease heartbeats: a consumer keeps a producer's KV alive while the request that will read it
still waits in the consumer's queue (longer than the producer's ``abort_timeout_seconds``)::

    consumer, scheduler half          consumer, worker half            producer (``leases``)
    on_waiting -> WaitList            HeartbeatSender: handshake       deadline = max(deadline,
    every heartbeat_interval_seconds  (``Peers.get``), then one          now + abort_timeout_seconds)
    -> Heartbeat per producer  ---->  notification per producer  ---->

A request is tracked while it waits for admission with a producer's params (``do_remote_prefill``,
something to read); tracking stops when its load starts, when a full local hit makes the read
unnecessary (NotifyOnly), or when it finishes or is aborted.

Wire format: ``b"\\xffHB"`` followed by the JSON list of the producer's request ids. A read
notification is ``"<request id>:<bytes>"`` encoded as UTF-8, where the byte 0xFF never occurs,
so the first byte tells the two apart whatever the ids contain (``:`` and ``,`` included).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Container, Sequence

from hybridkv.connectors.base import KVConnectorRequest
from hybridkv.connectors.nixl.agent import NixlAgent
from hybridkv.connectors.nixl.handshake import Key, Peers
from hybridkv.connectors.nixl.meta import Heartbeat, RemoteSource
from hybridkv.connectors.nixl.stats import NixlStats
from hybridkv.connectors.stats import StatsCounter

log = logging.getLogger(__name__)

TAG = b"\xffHB"  # 0xFF: never a byte of UTF-8 text, so never the start of a read notification
MAX_IDS = 256  # request ids per notification (a UCX active message stays small)

Clock = Callable[[], float]


def encode_heartbeats(request_ids: Sequence[str]) -> list[bytes]:
    """The notifications carrying ``request_ids`` (at most ``MAX_IDS`` each)."""
    ids = list(request_ids)
    return [TAG + json.dumps(ids[i : i + MAX_IDS]).encode() for i in range(0, len(ids), MAX_IDS)]


def parse_heartbeat(message: bytes) -> list[str] | None:
    """The request ids of a heartbeat; None if ``message`` is not one (a read notification).
    Raises ValueError for a heartbeat whose payload is not a JSON list of strings."""
    if not message.startswith(TAG):
        return None
    try:
        ids = json.loads(message[len(TAG) :])
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        ids = None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"malformed NIXL heartbeat {message[:64]!r}")
    return ids


class WaitList:
    """The consumer's scheduler half: the requests waiting for admission with params (the
    latest ``on_waiting`` list), and every ``interval`` seconds (by ``clock``) one ``Heartbeat``
    per producer for those with something to read, except ``skip`` (requests that read already:
    preempted after their load). A step costs O(1): the list is only read when a heartbeat is
    due, and each request's params are parsed once (``parse``: None when there is no producer)."""

    def __init__(
        self,
        interval: float,
        parse: Callable[[KVConnectorRequest], RemoteSource | None],
        skip: Container[str],
        clock: Clock = time.monotonic,
    ) -> None:
        self.interval = interval
        self.parse = parse
        self.skip = skip
        self.clock = clock
        self._parsed: dict[str, RemoteSource | None] = {}  # of the last heartbeat's list
        self._requests: Sequence[KVConnectorRequest] = ()
        self._stopped: set[str] = set()  # left the wait since the list was given
        self._due: float | None = None  # next heartbeat (None: nothing waits)

    def update(self, requests: Sequence[KVConnectorRequest]) -> None:
        """The requests waiting now (replacing the previous list)."""
        self._requests = requests
        self._stopped.clear()
        if not requests:
            self._due = None
        elif self._due is None:
            self._due = self.clock() + self.interval

    def stop(self, request_id: str) -> None:
        """The request's load started, or it needs none, or it ended: no more heartbeats."""
        if self._requests:
            self._stopped.add(request_id)

    def tracked(self) -> dict[str, RemoteSource]:
        """Local request id -> its producer's params, for the requests heartbeats cover."""
        out = {}
        old, self._parsed = self._parsed, {}
        for req in self._requests:
            rid = req.request_id
            src = self._parsed[rid] = old[rid] if rid in old else self.parse(req)
            live = rid not in self._stopped and rid not in self.skip
            if live and src is not None and src.num_tokens > 0:
                out[rid] = src
        return out

    def due(self) -> list[Heartbeat]:
        """The heartbeats to send now: none before an interval has passed since the first
        request began to wait (or since the last heartbeats)."""
        now = self.clock()
        if self._due is None or now < self._due:
            return []
        self._due = now + self.interval
        by_producer: dict[Key, tuple[RemoteSource, list[str]]] = {}
        for src in self.tracked().values():
            by_producer.setdefault(Peers.key(src), (src, []))[1].append(src.request_id)
        return [Heartbeat(src, tuple(ids)) for src, ids in by_producer.values()]


class HeartbeatSender:
    """The consumer's worker half: sends each producer its heartbeat once the handshake is
    done (``Peers.get`` starts it). A producer that cannot be reached is skipped; the
    request's load reports the failure later."""

    def __init__(self, agent: NixlAgent, peers: Peers, stats: StatsCounter[NixlStats]) -> None:
        self.agent = agent
        self.peers = peers
        self.stats = stats
        self._pending: dict[Key, Heartbeat] = {}  # per producer, the newest list

    def add(self, item: Heartbeat) -> None:
        self._pending[Peers.key(item.source)] = item

    def has_pending(self) -> bool:
        return bool(self._pending)

    def progress(self) -> int:
        """Send what can be sent; returns the request ids sent."""
        sent = 0
        for key, item in list(self._pending.items()):
            try:
                peer = self.peers.get(item.source)
            except Exception as exc:  # noqa: BLE001 - HandshakeFailed, or anything of that peer
                del self._pending[key]
                log.info("NIXL: no heartbeat to %s:%d: %s", key[1], key[2], exc)
                continue
            if peer is None:
                continue  # its handshake runs; a later step sends
            del self._pending[key]
            try:
                for message in encode_heartbeats(item.request_ids):
                    self.agent.notify(peer.agent_name, message)
            except Exception as exc:  # noqa: BLE001 - NIXL/UCX raise their own error types
                log.warning("NIXL: heartbeat to producer %s failed: %s", peer.agent_name, exc)
                continue
            sent += len(item.request_ids)
        if sent:
            with self.stats.update() as s:
                s.heartbeats_sent += sent
        return sent

"""Consumer side of the handshake: fetch each producer's descriptor once (in a background
thread), check it, add its agent; cached per (engine id, host, port)."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from hybridkv.connectors.nixl.agent import NixlAgent
from hybridkv.connectors.nixl.layout import LayoutDescriptor, check_compatible
from hybridkv.connectors.nixl.meta import RemoteSource
from hybridkv.connectors.nixl.side_channel import fetch
from hybridkv.connectors.nixl.stats import NixlStats
from hybridkv.connectors.stats import StatsCounter
from hybridkv.connectors.threads import SHUTDOWN_GRACE_SECONDS, stop_pool

log = logging.getLogger(__name__)

Key = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class Peer:
    descriptor: LayoutDescriptor
    agent_name: str
    leases: Any  # its lease words as a prepared descriptor list (``NixlAgent.prepare``)


class HandshakeFailed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Peers:
    def __init__(
        self,
        agent: NixlAgent,
        local: LayoutDescriptor,
        timeout: float,
        stats: StatsCounter[NixlStats],
        heartbeat_interval: float = 0.0,
    ) -> None:
        self.agent = agent
        self.local = local
        self.timeout = timeout
        self.stats = stats
        self.heartbeat_interval = heartbeat_interval  # this consumer's (0: off)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="nixl-handshake")
        self._fetching: dict[Key, Future[bytes]] = {}
        self._peers: dict[Key, Peer] = {}

    @staticmethod
    def key(src: RemoteSource) -> Key:
        return (src.engine_id, src.host, src.port)

    def get(self, src: RemoteSource) -> Peer | None:
        """The peer if its handshake is done; None while it runs (started on first ask).
        Raises HandshakeFailed (the next ask retries)."""
        key = self.key(src)
        peer = self._peers.get(key)
        if peer is not None:
            return peer
        future = self._fetching.get(key)
        if future is None:
            self._fetching[key] = self._pool.submit(fetch, src.host, src.port, self.timeout)
            return None
        if not future.done():
            return None
        del self._fetching[key]
        try:
            remote = LayoutDescriptor.decode(future.result())
        except (OSError, ValueError) as exc:
            with self.stats.update() as s:
                s.handshake_failures += 1
            raise HandshakeFailed(
                "nixl_handshake_failed",
                f"cannot reach the producer's side channel at {src.host}:{src.port} ({exc}); "
                f"is the prefill engine running with side_channel_port={src.port}?"
                if isinstance(exc, OSError)
                else f"the side channel at {src.host}:{src.port} answered: {exc}",
            ) from None
        return self._accept(key, src, remote)

    def _accept(self, key: Key, src: RemoteSource, remote: LayoutDescriptor) -> Peer:
        if remote.engine_id != src.engine_id:
            raise HandshakeFailed(
                "nixl_handshake_failed",
                f"the side channel at {src.host}:{src.port} is engine {remote.engine_id}, not "
                f"{src.engine_id}: the prefill engine restarted, so its KV is gone",
            )
        try:
            check_compatible(self.local, remote)
        except ValueError as exc:
            with self.stats.update() as s:
                s.handshake_failures += 1
            message = f"{src.host}:{src.port}: {exc}"
            log.error("NIXL handshake refused: %s", message)
            raise HandshakeFailed("nixl_incompatible", message) from None
        warn_slow_heartbeats(self.heartbeat_interval, remote.lease_seconds, src)
        name = self.agent.add_remote(remote.agent_metadata)
        with self.stats.update() as s:
            s.handshakes += 1
        words = [(remote.lease_base + 8 * i, 8) for i in range(remote.lease_words)]
        peer = Peer(remote, name, self.agent.prepare(name, words))
        self._peers[key] = peer
        return peer

    def forget(self, src: RemoteSource) -> None:
        """Drop a peer after a transfer failure: the next request handshakes again."""
        peer = self._peers.pop(self.key(src), None)
        if peer is not None:
            self.agent.release_prepared(peer.leases)
            self.agent.remove_remote(peer.agent_name)

    def close(self) -> None:
        """Stop the handshakes (joined within a grace) and drop every peer's agent."""
        stop_pool(self._pool, SHUTDOWN_GRACE_SECONDS)
        for peer in self._peers.values():
            self.agent.release_prepared(peer.leases)
            self.agent.remove_remote(peer.agent_name)
        self._peers.clear()


def warn_slow_heartbeats(interval: float, lease: float, src: RemoteSource) -> bool:
    """Warn (True) when this consumer's heartbeats come too rarely for a producer's leases:
    a lease runs ``lease`` seconds from its last heartbeat, and the first heartbeat leaves an
    interval after a request starts waiting, so an interval above half the lease lets a
    waiting request's lease expire (it then recomputes). Heartbeats off (0): no warning."""
    if interval <= 0 or lease <= 0 or interval <= lease / 2:
        return False
    log.warning(
        "NIXL: heartbeat_interval_seconds=%g on this decode engine is too long for the prefill "
        "engine at %s:%d, whose abort_timeout_seconds is %g: a request waiting here can lose "
        "its KV there between heartbeats; set heartbeat_interval_seconds to at most %g",
        interval, src.host, src.port, lease, lease / 2,
    )  # fmt: skip
    return True

"""Consumer side of the handshake: fetch each producer's descriptor once (in a background
thread), check it, add its agent; cached per (engine id, host, port).

Only verified params reach here (``RemoteSource.parse``: signed, a trusted host), so a client
cannot point the engine elsewhere. Bounds: ``MAX_WORKERS`` fetches run at once, each under one
deadline (``side_channel.fetch``), at most ``MAX_FETCHING`` wait; ``get`` never blocks and
turns every error of a fetch into ``HandshakeFailed`` for the loads that asked."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from hybridkv.connectors.nixl.agent import NixlAgent
from hybridkv.connectors.nixl.auth import AuthKey
from hybridkv.connectors.nixl.layout import LayoutDescriptor, check_compatible
from hybridkv.connectors.nixl.meta import ParamsRefused, RemoteSource
from hybridkv.connectors.nixl.side_channel import fetch
from hybridkv.connectors.nixl.stats import NixlStats
from hybridkv.connectors.stats import StatsCounter
from hybridkv.connectors.threads import SHUTDOWN_GRACE_SECONDS, stop_pool

log = logging.getLogger(__name__)

Key = tuple[str, str, int]
MAX_WORKERS = 4  # handshakes at once
MAX_FETCHING = 64  # producers being handshaken (running or queued)


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
        key: AuthKey,
        heartbeat_interval: float = 0.0,
    ) -> None:
        self.agent = agent
        self.auth = key
        self.local = local
        self.timeout = timeout
        self.stats = stats
        self.heartbeat_interval = heartbeat_interval  # this consumer's (0: off)
        self._pool = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="nixl-handshake")
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
            if len(self._fetching) >= MAX_FETCHING:
                raise self._failed(src, "too many producers being handshaken at once")
            args = (src.host, src.port, self.timeout, self.auth)
            self._fetching[key] = self._pool.submit(fetch, *args)
            return None
        if not future.done():
            return None
        del self._fetching[key]
        try:
            remote = LayoutDescriptor.decode(future.result())
        except OSError as exc:
            raise self._failed(
                src,
                f"cannot reach the producer's side channel at {src.host}:{src.port} ({exc}); "
                f"is the prefill engine running with side_channel_port={src.port}?",
            ) from None
        except Exception as exc:  # noqa: BLE001 - refused, malformed: that producer only
            raise self._failed(src, f"the side channel at {src.host}:{src.port}: {exc}") from None
        return self._accept(key, src, remote)

    def _failed(self, src: RemoteSource, message: str) -> HandshakeFailed:
        with self.stats.update() as s:
            s.handshake_failures += 1
        log.warning("NIXL handshake with %s:%d failed: %s", src.host, src.port, message)
        return HandshakeFailed("nixl_handshake_failed", message)

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


def check_indices(src: RemoteSource, remote: LayoutDescriptor) -> None:
    """Every remote index of ``src`` inside the producer's descriptor, else ParamsRefused."""
    bad = ""
    if any(b >= remote.num_blocks for t in src.block_ids for b in t):
        bad = f"a remote block id is not below the producer's {remote.num_blocks} blocks"
    elif src.staged_state is not None and src.staged_state >= remote.staging_entries:
        bad = f"remote_state {src.staged_state} is not below {remote.staging_entries} entries"
    elif src.lease is not None and src.lease.slot >= remote.lease_words:
        bad = f"remote_lease slot {src.lease.slot} is not below {remote.lease_words} words"
    if bad:
        raise ParamsRefused("nixl_params_malformed", f"kv_transfer_params: {bad}")

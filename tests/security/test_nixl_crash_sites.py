"""Issue 26, finding 1's crash sites and finding 10's early-notification table: what used to
raise on the engine thread (``Peers.get`` on a port of 10**30, ``HeartbeatSender.progress`` and
``Reader._send_notifications`` on an unexpected error, a producer's notification with non-ASCII
digits) now fails that one item, and the table of early notifications forgets by age and
size."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridkv.connectors.nixl.handshake import HandshakeFailed, Peers
from hybridkv.connectors.nixl.heartbeats import HeartbeatSender
from hybridkv.connectors.nixl.layout import GroupDesc, LayoutDescriptor
from hybridkv.connectors.nixl.leases import EARLY_LIMIT, EARLY_SECONDS, Leases
from hybridkv.connectors.nixl.meta import Heartbeat, Lease, NotifyOnly, RemoteSource
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.reader import Reader
from hybridkv.connectors.nixl.stats import NixlStats
from hybridkv.connectors.stats import StatsCounter
from tests.connectors.nixl.signing import TEST_KEY

LOCAL = LayoutDescriptor("d", "c", 16, 64, (1 << 20,), (GroupDesc("full_attention", 0, 1, 2),),
                         (), 0, 0, b"", 0, 0, "a:w:d", num_blocks=8)  # fmt: skip


def source(port: int) -> RemoteSource:
    return RemoteSource("p", "127.0.0.1", port, "r", ((1,),), (0,), None, 16, Lease(0, 1))


def test_a_port_beyond_range_fails_the_handshake_not_the_engine() -> None:
    peers = Peers(None, LOCAL, 1.0, StatsCounter(NixlStats), TEST_KEY)  # type: ignore[arg-type]
    try:
        src = source(10**30)  # what RemoteSource.parse used to let through
        assert peers.get(src) is None
        peers._fetching[Peers.key(src)].exception(timeout=5)  # OverflowError in the worker
        try:
            peers.get(src)
            raise AssertionError("expected HandshakeFailed")
        except HandshakeFailed as exc:
            assert exc.reason == "nixl_handshake_failed"
    finally:
        peers.close()


class Exploding:
    def get(self, src: RemoteSource) -> Any:
        raise RuntimeError("a peer's bug")

    def forget(self, src: RemoteSource) -> None:
        raise AssertionError("a shared peer must not be forgotten")


def test_heartbeats_and_notifications_survive_any_error_of_a_peer() -> None:
    stats = StatsCounter(NixlStats)
    sender = HeartbeatSender(None, Exploding(), stats)  # type: ignore[arg-type]
    sender.add(Heartbeat(source(1), ("a",)))
    assert sender.progress() == 0 and not sender.has_pending()
    scratch = torch.zeros(4, dtype=torch.int64)

    class Agent:
        def prepare(self, remote: str | None, regions: list[tuple[int, int]]) -> str:
            return "prepared"

    reader = Reader(NixlOptions(), Agent(), Exploding(), LOCAL, stats, scratch)  # type: ignore[arg-type]
    reader.notify.append(NotifyOnly(source(1)))
    reader.progress()
    assert reader.notify == [] and not reader.has_pending()


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_early_notifications_expire_by_age_and_size() -> None:
    clock, stats = Clock(), StatsCounter(NixlStats)
    leases = Leases(stats, np.zeros(4, dtype=np.uint64), clock)
    leases.on_notifications([b"early:10"])
    clock.now += EARLY_SECONDS + 1
    leases.take_finished()
    leases.start("early", 30.0, Lease(0, 1))  # its notification is too old to count now
    assert leases.deadlines["early"] > clock.now
    for i in range(EARLY_LIMIT + 100):
        leases.on_notifications([f"x{i}:1".encode()])
    assert len(leases._early) == EARLY_LIMIT and "x0" not in leases._early
    assert f"x{EARLY_LIMIT + 99}" in leases._early
    assert stats.take().notifications_unmatched == 1 + 100


def test_a_hostile_notification_is_counted_not_raised() -> None:
    stats = StatsCounter(NixlStats)
    leases = Leases(stats, np.zeros(4, dtype=np.uint64), Clock())
    hostile = [
        "r:²".encode(),
        b"r:" + b"9" * 5000,
        b"\x00" * 100_000,
        b":",
        b"r:-1",
        "r:١٢".encode(),
    ]
    assert not leases.on_notifications(hostile)
    assert stats.take().notifications_unmatched == len(hostile)


def test_an_index_outside_the_producer_fails_that_load_and_keeps_the_peer() -> None:
    """A remote block id past the producer's blocks (or a lease slot past its words) fails
    that load as malformed before any READ; the peer other loads share is not forgotten."""
    from tests.connectors.nixl.test_reader_notify import OnePeer, ScriptedAgent, descriptor, load

    class Peer(OnePeer):
        def forget(self, source: RemoteSource) -> None:
            raise AssertionError("a shared peer must not be forgotten")

    agent, stats = ScriptedAgent(word=1), StatsCounter(NixlStats)
    scratch = torch.zeros(8, dtype=torch.int64)
    reader = Reader(NixlOptions(), agent, Peer(), descriptor("c", 1 << 20), stats, scratch)  # type: ignore[arg-type]
    agent.reader = reader
    spec = load("far", 16 * 70)  # blocks 1..70, the producer has 64
    reader.add(spec, 0.0)
    reader.add(load("near", 40), 0.0)
    reader.progress()
    reasons = {d.request_id: d.request_reason for d in reader.done}
    assert reasons["near"] is None
    assert reasons["far"] is not None and reasons["far"].startswith("nixl_params_malformed")
    assert stats.take().failures == {"nixl_params_malformed": 1}

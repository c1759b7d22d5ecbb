"""Lease heartbeats without engines: the producer's ``Leases`` extends held leases (and only
those), heartbeats and read notifications parse apart whatever the ids contain, the consumer's
scheduler half emits the right ids per producer on its interval (injectable clock) and stops
tracking on load start, full local hit, finish and abort, and its worker half sends through a
scripted agent once the handshake is done."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pytest

from hybridkv.connectors.base import KVConnectorRequest, RequestBlocks
from hybridkv.connectors.nixl.handshake import HandshakeFailed, Peer, warn_slow_heartbeats
from hybridkv.connectors.nixl.heartbeats import (
    MAX_IDS,
    TAG,
    HeartbeatSender,
    encode_heartbeats,
    parse_heartbeat,
)
from hybridkv.connectors.nixl.layout import (
    PROTOCOL_VERSION,
    GroupDesc,
    LayoutDescriptor,
)
from hybridkv.connectors.nixl.leases import ENDED, Leases
from hybridkv.connectors.nixl.meta import Heartbeat, Lease, NotifyOnly, RemoteSource
from hybridkv.connectors.nixl.metrics import nixl_families
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.scheduler import NixlScheduler
from hybridkv.connectors.nixl.stats import Flow, NixlStats
from hybridkv.connectors.stats import StatsCounter
from hybridkv.request import RequestStatus
from hybridkv.sampling.transfer_params import TransferFields, parse_transfer_params
from tests.connectors.nixl.signing import policy, signed

TIMEOUT = 100.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def leases(clock: Clock) -> tuple[Leases, StatsCounter[NixlStats]]:
    stats = StatsCounter(NixlStats)
    return Leases(stats, np.zeros(8, dtype=np.uint64), clock), stats


# -- producer: Leases ---------------------------------------------------------------------------


def test_a_heartbeat_keeps_a_lease_past_its_original_deadline() -> None:
    clock = Clock()
    held, stats = leases(clock)
    held.start("a:1", TIMEOUT, Lease(3, 7))
    held.start("b", TIMEOUT, Lease(4, 8))
    clock.now += 0.9 * TIMEOUT
    held.on_notifications(encode_heartbeats(["a:1"]))
    clock.now += 0.5 * TIMEOUT  # past the original deadline (1.4 T after the start)
    assert held.take_finished() == {"b"}  # b expired, a was extended to 1.9 T
    assert held.words[3] == 7 and held.words[4] == 8 | ENDED
    clock.now += 0.5 * TIMEOUT
    assert held.take_finished() == {"a:1"}
    s = stats.take()
    assert (s.heartbeats_received, s.heartbeats_unmatched, s.leases_expired) == (1, 0, 2)


def test_a_heartbeat_never_shortens_a_deadline_nor_revives_a_read_lease() -> None:
    clock = Clock()
    held, _ = leases(clock)
    held.start("a", TIMEOUT, Lease(0, 1))
    held.start("b", TIMEOUT, Lease(1, 2))
    held.on_notifications([b"b:4096"])  # b was read: reported at the next take
    held.heartbeat(["a", "b"])  # at the start: max(deadline, now + T) changes nothing
    assert held.deadlines == {"a": clock.now + TIMEOUT, "b": 0.0}
    assert held.take_finished() == {"b"}


def test_unknown_and_ended_ids_do_nothing_but_count() -> None:
    clock = Clock()
    held, stats = leases(clock)
    held.start("a", TIMEOUT, Lease(0, 1))
    clock.now += 2 * TIMEOUT
    assert held.take_finished() == {"a"}  # ended (expired)
    held.on_notifications(encode_heartbeats(["a", "never-seen"]) + [TAG + b"{not json"])
    assert held.deadlines == {} and held.words[0] == 1 | ENDED
    s = stats.take()
    assert (s.heartbeats_received, s.heartbeats_unmatched) == (3, 3)
    assert s.notifications_unmatched == 0  # not mistaken for early read notifications


@pytest.mark.parametrize("rid", ["x", "cmpl-1:2", "a,b", "HB:a,b", "9:9", '["q"]', "é:ü"])
def test_heartbeats_and_read_notifications_parse_apart(rid: str) -> None:
    (message,) = encode_heartbeats([rid, "other"])
    assert parse_heartbeat(message) == [rid, "other"]
    read = f"{rid}:512".encode()  # how a consumer's read notification looks
    assert parse_heartbeat(read) is None
    clock = Clock()
    held, stats = leases(clock)
    held.start(rid, TIMEOUT, Lease(0, 1))
    clock.now += 0.5 * TIMEOUT
    held.on_notifications([message])
    assert held.deadlines[rid] == clock.now + TIMEOUT  # the heartbeat extended it
    held.on_notifications([read])
    assert held.deadlines[rid] == 0.0 and held.take_finished() == {rid}
    s = stats.take()
    assert s.nbytes[Flow.SEND] == 512
    assert (s.heartbeats_received, s.heartbeats_unmatched) == (2, 1)


def test_long_lists_are_split_and_malformed_heartbeats_refused() -> None:
    ids = [f"r{i}" for i in range(2 * MAX_IDS + 1)]
    messages = encode_heartbeats(ids)
    assert len(messages) == 3
    assert [i for m in messages for i in parse_heartbeat(m) or []] == ids
    assert encode_heartbeats([]) == []
    for bad in (TAG + b"{}", TAG + b"[1]", TAG + b"\xff"):
        with pytest.raises(ValueError, match="malformed NIXL heartbeat"):
            parse_heartbeat(bad)


# -- consumer: the scheduler half ---------------------------------------------------------------


@dataclass
class Req:
    request_id: str
    kv_transfer_params: dict[str, Any] | None
    num_computed_tokens: int = 0
    num_prompt_tokens: int = 64
    status: RequestStatus = RequestStatus.WAITING
    all_token_ids: list[int] = field(default_factory=list)

    @property
    def transfer_fields(self) -> TransferFields | None:
        """Parsed as the API boundary does (``SamplingParams``)."""
        params = self.kv_transfer_params
        return parse_transfer_params(params) if params else None


def params(rid: str, port: int = 1, tokens: int = 32) -> dict[str, Any]:
    return signed({
        "do_remote_prefill": True, "remote_engine_id": f"p{port}", "remote_host": "127.0.0.1",
        "remote_port": port, "remote_request_id": rid, "remote_block_ids": [[1, 2]],
        "remote_block_starts": [0], "remote_state": [], "num_tokens": tokens,
        "remote_lease": [0, 1],
    })  # fmt: skip


def consumer(interval: float = 10.0, clock: Clock | None = None) -> NixlScheduler:
    options = NixlOptions(heartbeat_interval_seconds=interval)
    groups = (GroupDesc("full_attention", 0, 2, 64),)
    sched = NixlScheduler(options, "d", groups, 16, False, True, policy())
    if sched.waits is not None and clock is not None:
        sched.waits.clock = clock
    return sched


def reqs(*items: Req) -> list[KVConnectorRequest]:
    return [cast(KVConnectorRequest, r) for r in items]


def beats(sched: NixlScheduler) -> dict[int, list[str]]:
    """This step's heartbeats: producer port -> remote request ids."""
    items = sched.build_connector_meta([]).saves
    return {i.source.port: list(i.request_ids) for i in items if isinstance(i, Heartbeat)}


def test_nothing_before_the_interval_then_the_right_ids_per_producer() -> None:
    clock = Clock()
    sched = consumer(10.0, clock)
    a, b, c = Req("a", params("pa")), Req("b", params("pb", 2)), Req("c", params("pc"))
    plain = Req("plain", None)
    zero = Req("zero", params("pz", tokens=0))  # the producer holds nothing for it
    sched.on_waiting(reqs(a, b, c, plain, zero))
    clock.now += 9.99
    assert beats(sched) == {}
    clock.now += 0.01
    assert beats(sched) == {1: ["pa", "pc"], 2: ["pb"]}
    clock.now += 5
    sched.on_waiting(reqs(a, b, c))
    assert beats(sched) == {}  # the next one is an interval after the last
    clock.now += 5
    assert beats(sched) == {1: ["pa", "pc"], 2: ["pb"]}


def test_tracking_stops_on_load_start_full_local_hit_finish_and_abort() -> None:
    clock = Clock()
    sched = consumer(10.0, clock)
    load, hit, done, gone, stays = (Req(r, params("p" + r)) for r in ("l", "h", "d", "g", "s"))
    sched.on_waiting(reqs(load, hit, done, gone, stays))
    load.num_computed_tokens = 32
    blocks = RequestBlocks(([5, 6],), ())
    sched.update_state_after_alloc(cast(KVConnectorRequest, load), blocks, 32)  # load starts
    sched.update_state_after_alloc(cast(KVConnectorRequest, hit), blocks, 0)  # full local hit
    done.status = RequestStatus.FINISHED_ABORTED
    sched.request_finished(cast(KVConnectorRequest, done), RequestBlocks(([],), ()))
    meta = sched.build_connector_meta([])
    assert [s.request_id for s in meta.loads] == ["l"]
    assert {i.source.request_id for i in meta.saves if isinstance(i, NotifyOnly)} == {"ph", "pd"}
    clock.now += 10
    assert beats(sched) == {1: ["pg", "ps"]}  # the same step's list: l, h, d stopped
    sched.on_waiting(reqs(stays))  # "gone" was aborted before its lookup: no longer waiting
    clock.now += 10
    assert beats(sched) == {1: ["ps"]}
    load.status = RequestStatus.PREEMPTED  # back in the queue after its load: never again
    sched.on_waiting(reqs(load, stays))
    sched.on_waiting([])
    clock.now += 100
    assert beats(sched) == {}


def test_a_request_dropped_while_waiting_frees_its_producer_at_once() -> None:
    """Aborted before admission (no KV, so no ``request_finished``): NotifyOnly to its
    producer, which frees now instead of after its lease; nothing for a request that read
    already or had nothing to read; the half reports the item pending until it is sent."""
    sched = consumer(0.0)  # heartbeats off: the drop works without them
    read, dropped, zero = Req("r", params("pr")), Req("x", params("px")), Req("z", params("pz", tokens=0))  # fmt: skip
    read.num_computed_tokens = 32
    sched.update_state_after_alloc(cast(KVConnectorRequest, read), RequestBlocks(([5, 6],), ()), 32)  # fmt: skip
    sched.build_connector_meta([])  # r's load goes out
    assert not sched.has_pending()
    read.status = RequestStatus.PREEMPTED
    for r in (read, dropped, zero):
        sched.request_dropped(cast(KVConnectorRequest, r))
    assert sched.has_pending()
    meta = sched.build_connector_meta([])
    assert [i.source.request_id for i in meta.saves if isinstance(i, NotifyOnly)] == ["px"]
    assert not sched.has_pending()


def test_disabled_by_zero_or_on_a_producer() -> None:
    assert consumer(0.0).waits is None
    groups = (GroupDesc("full_attention", 0, 2, 64),)
    p = NixlScheduler(NixlOptions(), "p", groups, 16, True, False, policy())
    assert p.waits is None
    p.on_waiting(reqs(Req("a", params("pa"))))
    assert p.build_connector_meta([]).saves == []


@pytest.mark.parametrize("bad", [-1, -0.5, "10", None, True, float("nan"), float("inf")])
def test_the_interval_is_checked(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"heartbeat_interval_seconds=.* must be a number"):
        NixlOptions.parse({"heartbeat_interval_seconds": bad})
    assert NixlOptions.parse({"heartbeat_interval_seconds": 0}).heartbeat_interval_seconds == 0


# -- consumer: the worker half ------------------------------------------------------------------


class ScriptedPeers:
    """Handshakes answer after ``wait`` asks; ports in ``down`` fail."""

    def __init__(self, wait: int, down: set[int]) -> None:
        self.asks: dict[int, int] = {}
        self.wait, self.down = wait, down

    def get(self, src: RemoteSource) -> Peer | None:
        self.asks[src.port] = self.asks.get(src.port, 0) + 1
        if src.port in self.down:
            raise HandshakeFailed("nixl_handshake_failed", "connection refused")
        if self.asks[src.port] <= self.wait:
            return None
        return Peer(cast(LayoutDescriptor, None), f"agent{src.port}", None)


class ScriptedAgent:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def notify(self, remote: str, message: bytes) -> None:
        self.sent.append((remote, message))


def heartbeat(port: int, *ids: str) -> Heartbeat:
    src = RemoteSource.parse(parse_transfer_params(params(ids[0], port)), [], (1, False), policy())
    return Heartbeat(src, ids)


def test_the_worker_sends_after_the_handshake_and_skips_unreachable_producers() -> None:
    agent, peers, stats = ScriptedAgent(), ScriptedPeers(wait=1, down={3}), StatsCounter(NixlStats)
    sender = HeartbeatSender(agent, peers, stats)  # type: ignore[arg-type]
    sender.add(heartbeat(1, "x", "y:1"))
    sender.add(heartbeat(3, "z"))
    assert sender.progress() == 0  # 1: handshake started; 3: refused, skipped
    assert agent.sent == [] and sender.has_pending()
    sender.add(heartbeat(1, "x", "y:1", "w"))  # a newer list replaces the one still waiting
    assert sender.progress() == 3
    assert agent.sent == [("agent1", TAG + json.dumps(["x", "y:1", "w"]).encode())]
    assert not sender.has_pending() and peers.asks == {1: 2, 3: 1}
    assert stats.take().heartbeats_sent == 3


def test_a_peer_of_the_old_protocol_is_refused_by_version() -> None:
    desc = LayoutDescriptor("p", "c", 16, 1, (), (), (), 0, 0)
    data = json.loads(desc.encode())
    assert data["version"] == PROTOCOL_VERSION == 5
    data["version"] = 4
    with pytest.raises(ValueError, match="protocol version 4, this engine 5"):
        LayoutDescriptor.decode(json.dumps(data).encode())
    assert LayoutDescriptor.decode(desc.encode()) == desc


def test_heartbeat_counters_are_prometheus_families() -> None:
    counters = {"nixl_heartbeats_sent": 3, "nixl_heartbeats_received": 2, "nixl_heartbeats_unmatched": 1}  # fmt: skip
    families = {f.name: f for f in nixl_families(counters, "hybridkv:")}
    for name, value in (("sent", 3), ("received", 2), ("unmatched", 1)):
        (sample,) = families[f"hybridkv:kv_transfer_heartbeats_{name}"].samples
        assert sample.value == value and sample.labels == {"connector": "NixlConnector"}


def test_heartbeats_too_rare_for_the_producers_lease_are_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The producer's abort_timeout_seconds travels in its descriptor; a consumer whose interval
    exceeds half of it is told, with both options and the value to use."""
    src = RemoteSource.parse(parse_transfer_params(params("r", 7)), [], (1, False), policy())
    with caplog.at_level(logging.WARNING, logger="hybridkv.connectors.nixl.handshake"):
        assert warn_slow_heartbeats(70.0, 120.0, src)
        assert not warn_slow_heartbeats(60.0, 120.0, src)  # at half: renewed in time
        assert not warn_slow_heartbeats(0.0, 120.0, src)  # heartbeats off: the user's choice
        assert not warn_slow_heartbeats(70.0, 0.0, src)  # not a producer
    (line,) = [r.getMessage() for r in caplog.records]
    assert "heartbeat_interval_seconds=70" in line and "abort_timeout_seconds is 120" in line
    assert "127.0.0.1:7" in line and "at most 60" in line
    desc = LayoutDescriptor("p", "c", 16, 1, (), (), (), 0, 0, lease_seconds=120.0)
    assert LayoutDescriptor.decode(desc.encode()).lease_seconds == 120.0

"""What KV events expose, and to whom (issue 26, finding 5): by default the PUB socket binds
loopback only; binding an address other hosts reach is a logged warning; a replay socket off
loopback needs ``allow_remote_replay`` (and warns); a salted request's token ids are never
published, and ``omit_token_ids`` omits everyone's -- in vLLM's schema still."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import zmq

from hybridkv.kv.hashing import BlockHasher, get_hash_fn
from hybridkv.kv_events import config as events_config
from hybridkv.kv_events.collector import KVEventCollector
from hybridkv.kv_events.config import DEFAULT_ENDPOINT, KVEventsConfig, is_loopback
from hybridkv.kv_events.publisher import ZmqEventPublisher
from hybridkv.request import Request
from hybridkv.sampling.params import SamplingParams
from tests.kv.builders import B, FakeRequest
from tests.kv_events.test_collector import Capture, TokenRequest, prefill, setup
from tests.kv_events.vllm_schema import BlockStored
from tests.support.ports import free_port

LOG = "hybridkv.kv_events.publisher"


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def open_publisher(
    config: KVEventsConfig, ctx: zmq.Context[zmq.Socket[bytes]]
) -> ZmqEventPublisher:
    return ZmqEventPublisher(config, ctx)


# -- where the sockets listen ---------------------------------------------------------------


def test_the_default_binds_loopback_and_explicit_endpoints_follow_vllm() -> None:
    default = KVEventsConfig(True)
    assert (default.pub_endpoint, default.binds) == (DEFAULT_ENDPOINT, True)
    assert DEFAULT_ENDPOINT == "tcp://127.0.0.1:5557"
    assert not KVEventsConfig(True, endpoint="tcp://127.0.0.1:5557").binds  # a router bound it
    assert KVEventsConfig(True, endpoint="tcp://*:5557").binds
    assert KVEventsConfig(True, endpoint="tcp://10.0.0.5:5557", bind=True).binds
    assert not KVEventsConfig(True, bind=False).binds


@pytest.mark.parametrize(
    ("endpoint", "loopback"),
    [
        ("tcp://127.0.0.1:5557", True),
        ("tcp://127.0.0.2:*", True),
        ("tcp://localhost:1", True),
        ("tcp://[::1]:1", True),
        ("tcp://lo:1", True),
        ("ipc:///tmp/x.sock", True),
        ("tcp://*:5557", False),
        ("tcp://0.0.0.0:5557", False),
        ("tcp://[::]:1", False),
        ("tcp://eth0:1", False),
        ("tcp://10.0.0.5:5557", False),
    ],
)
def test_is_loopback(endpoint: str, loopback: bool) -> None:
    assert is_loopback(endpoint) is loopback


def test_the_default_socket_listens_on_loopback_quietly(
    ctx: zmq.Context[zmq.Socket[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    monkeypatch.setattr(events_config, "DEFAULT_ENDPOINT", f"tcp://127.0.0.1:{port}")
    with caplog.at_level(logging.WARNING, LOG):
        publisher = open_publisher(KVEventsConfig(True), ctx)
    try:
        bound = publisher._pub.getsockopt(zmq.LAST_ENDPOINT)
        assert bound == f"tcp://127.0.0.1:{port}".encode()
        assert not caplog.records
    finally:
        publisher.shutdown()


def test_a_wildcard_bind_warns(
    ctx: zmq.Context[zmq.Socket[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, LOG):
        publisher = open_publisher(KVEventsConfig(True, endpoint=f"tcp://*:{free_port()}"), ctx)
    publisher.shutdown()
    (record,) = caplog.records
    assert "the publisher bound on tcp://*:" in record.getMessage()
    assert "reachable from other hosts" in record.getMessage()


def test_a_remote_replay_socket_needs_allowing_and_warns(
    ctx: zmq.Context[zmq.Socket[bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    remote = f"tcp://0.0.0.0:{free_port()}"
    with pytest.raises(ValueError, match="replay_endpoint=.*allow_remote_replay=true"):
        KVEventsConfig(True, replay_endpoint=remote)
    KVEventsConfig(True, replay_endpoint="tcp://127.0.0.1:5558")  # loopback: fine
    config = KVEventsConfig(
        True, endpoint="tcp://127.0.0.1:*", replay_endpoint=remote, allow_remote_replay=True
    )
    with caplog.at_level(logging.WARNING, LOG):
        publisher = open_publisher(config, ctx)
    publisher.shutdown()
    (record,) = caplog.records
    assert "the replay socket bound on tcp://0.0.0.0:" in record.getMessage()
    assert "the last 10000 batches" in record.getMessage()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"bind": "yes"}, "bind='yes' must be a bool"),
        ({"omit_token_ids": 1}, "omit_token_ids=1 must be a bool"),
        ({"allow_remote_replay": None}, "allow_remote_replay=None must be a bool"),
        ({"endpoint": None, "replay_endpoint": "tcp://*:1"}, "allow_remote_replay"),
    ],
)
def test_the_new_keys_are_checked(value: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match="kv_events_config") as info:
        events_config.parse_kv_events_config(value)
    assert message in str(info.value)


def test_a_hostile_replay_request_is_dropped_and_replay_goes_on(
    ctx: zmq.Context[zmq.Socket[bytes]], tmp_path: object
) -> None:
    replay = f"tcp://127.0.0.1:{free_port()}"
    config = KVEventsConfig(True, "zmq", "tcp://127.0.0.1:*", replay, heartbeat_seconds=0)
    publisher = open_publisher(config, ctx)
    try:
        hostile = ctx.socket(zmq.DEALER)
        hostile.connect(replay)
        hostile.send_multipart((b"", b"\0" * (1 << 20)))  # a 1 MiB "sequence number"
        odd = ctx.socket(zmq.DEALER)
        odd.connect(replay)
        odd.send_multipart((b"", b"\0\0\1"))  # 3 bytes: ignored
        assert not odd.poll(300)
        honest = ctx.socket(zmq.DEALER)
        honest.connect(replay)
        honest.send_multipart((b"", (0).to_bytes(8, "big")))
        assert honest.poll(5000), "the replay socket stopped answering"
        assert honest.recv_multipart()[2] == (-1).to_bytes(8, "big", signed=True)  # empty
        for sock in (hostile, odd, honest):
            sock.close(linger=0)
    finally:
        publisher.shutdown()


# -- token ids ---------------------------------------------------------------------------


def stored_events(capture: Capture) -> list[BlockStored]:
    return [ev for b in capture.batches for ev in b.events if isinstance(ev, BlockStored)]


def test_a_salted_request_publishes_hashes_without_tokens() -> None:
    coord, collector, capture = setup("gemma3")
    plain = TokenRequest("a", list(range(100, 100 + 3 * B + 1)))
    salted = TokenRequest("b", list(range(500, 500 + 3 * B + 1)), cache_salt="tenant-1")
    prefill(coord, plain)
    collector.publish_step(coord.take_events())
    prefill(coord, salted)
    collector.publish_step(coord.take_events())
    first, second = capture.batches  # decoded with vLLM's schema (Capture goes through it)
    assert all(ev.token_ids for ev in first.events if isinstance(ev, BlockStored))
    salted_events = [ev for ev in second.events if isinstance(ev, BlockStored)]
    assert salted_events and all(ev.token_ids == [] for ev in salted_events)
    assert {h for ev in salted_events for h in ev.block_hashes} <= set(salted.block_hashes)
    assert salted_events[0].block_size == B and salted_events[0].medium == "GPU"


def test_omit_token_ids_applies_to_every_request() -> None:
    coord, _, capture = setup("full")
    collector = KVEventCollector(coord.layout, capture, omit_token_ids=True)
    prefill(coord, TokenRequest("a", list(range(100, 100 + 3 * B + 1))))
    collector.publish_step(coord.take_events())
    events = stored_events(capture)
    assert events and all(ev.token_ids == [] and ev.block_hashes for ev in events)


@dataclass
class UnsureRequest(FakeRequest):
    """Tokens, but no word on a salt."""

    @property
    def all_token_ids(self) -> list[int]:
        return self.token_ids


def test_a_request_that_cannot_say_it_is_unsalted_publishes_no_tokens() -> None:
    coord, collector, capture = setup("full")
    prefill(coord, UnsureRequest("a", list(range(100, 100 + 3 * B + 1))))
    collector.publish_step(coord.take_events())
    events = stored_events(capture)
    assert events and all(ev.token_ids == [] for ev in events)


def test_a_real_request_knows_it_is_salted() -> None:
    def request(salt: str | None) -> Request:
        return Request(
            "r", [1, 2, 3], SamplingParams(), BlockHasher(B, get_hash_fn("sha256"), salt)
        )

    assert request("tenant").salted and not request(None).salted

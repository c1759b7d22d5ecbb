"""The ZMQ publisher: vLLM's multipart framing, replay, a bounded queue that drops the oldest
batches (counted) when its thread falls behind, and clear errors for a bad endpoint."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from hybridkv.kv_events.config import KVEventsConfig
from hybridkv.kv_events.publisher import END_SEQ, ZmqEventPublisher
from hybridkv.kv_events.schema import AllBlocksCleared, BlockRemoved, KVEventBatch
from tests.kv_events.vllm_schema import DECODER


def batch(i: int) -> KVEventBatch:
    removed = BlockRemoved(block_hashes=[bytes([i]) * 32], medium="GPU", group_idx=i % 2)
    return KVEventBatch(ts=float(i), events=[removed, AllBlocksCleared()], data_parallel_rank=0)


@pytest.fixture
def ctx() -> zmq.Context[zmq.Socket[bytes]]:
    return zmq.Context.instance()


@pytest.fixture
def endpoints(tmp_path: Path) -> Iterator[tuple[str, str]]:
    yield f"ipc://{tmp_path}/pub.sock", f"ipc://{tmp_path}/replay.sock"


def test_frames_are_topic_seq_payload_and_replay_serves_from_a_seq(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoints: tuple[str, str]
) -> None:
    pub_ep, replay_ep = endpoints
    config = KVEventsConfig(
        True, "zmq", pub_ep, replay_ep, buffer_steps=4, topic="kv", heartbeat_seconds=0
    )
    publisher = ZmqEventPublisher(config)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(pub_ep)
    try:
        received: list[list[bytes]] = []
        for i in range(50):  # until the subscription reached the PUB socket
            publisher.publish(batch(i))
            if sub.poll(20):
                received.append(sub.recv_multipart())
                break
        assert received, "no batch arrived"
        first = int.from_bytes(received[0][1], "big")
        for i in range(first + 1, first + 4):
            publisher.publish(batch(i))
        while len(received) < 4 and sub.poll(2000):
            received.append(sub.recv_multipart())
        seqs = [int.from_bytes(f[1], "big") for f in received]
        assert seqs == list(range(first, first + 4)) and {f[0] for f in received} == {b"kv"}
        decoded = DECODER.decode(received[-1][2])
        assert decoded.ts == float(first + 3) and decoded.data_parallel_rank == 0
        assert decoded.events[0].block_hashes == [bytes([first + 3]) * 32]

        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(replay_ep)
        dealer.send_multipart((b"", (first + 2).to_bytes(8, "big")))
        replies = []
        while True:
            assert dealer.poll(5000)
            replies.append(dealer.recv_multipart())
            if replies[-1][2] == END_SEQ:
                break
        dealer.close(linger=0)
        assert [r[2] for r in replies[:-1]] == [
            s.to_bytes(8, "big") for s in (first + 2, first + 3)
        ]
        assert [r[3] for r in replies[:-1]] == [f[2] for f in received[2:]]
        assert replies[-1] == [b"", b"", END_SEQ, b""]
        assert publisher.stats().dropped_batches == 0
    finally:
        sub.close(linger=0)
        publisher.shutdown()


class _BlockingSocket:
    """Stands in for the PUB socket: the first send waits until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.sent: list[tuple[bytes, ...]] = []

    def send_multipart(self, frames: tuple[bytes, ...], copy: bool = True) -> None:
        self.entered.set()
        self.release.wait(10)
        self.sent.append(frames)

    def close(self, linger: int = 0) -> None:
        return None


def test_a_full_queue_drops_the_oldest_and_counts(endpoints: tuple[str, str]) -> None:
    config = KVEventsConfig(True, "zmq", endpoints[0], max_queue_size=3, heartbeat_seconds=0)
    publisher = ZmqEventPublisher(config)
    real = publisher._pub
    fake: Any = _BlockingSocket()
    publisher._pub = fake
    try:
        publisher.publish(batch(0))
        assert fake.entered.wait(5)  # the thread holds batch 0 in a blocked send
        start = time.perf_counter()
        for i in range(1, 11):
            publisher.publish(batch(i))  # never blocks
        assert time.perf_counter() - start < 0.5
        assert publisher.stats().dropped_batches == 7
        fake.release.set()
        assert publisher.flush(5.0)
        sent = [DECODER.decode(frames[2]).ts for frames in fake.sent]
        assert sent == [0.0, 8.0, 9.0, 10.0]  # the newest three survived
        # sequence numbers are given at publish: the dropped batches are a gap subscribers see
        assert [int.from_bytes(f[1], "big") for f in fake.sent] == [0, 8, 9, 10]
        assert publisher.last_seq == 10
        assert publisher.stats().published_batches == 4
    finally:
        fake.release.set()
        publisher.shutdown()
        real.close(linger=0)


def test_an_endpoint_that_cannot_bind_is_a_clear_error(endpoints: tuple[str, str]) -> None:
    first = ZmqEventPublisher(KVEventsConfig(True, "zmq", "tcp://127.0.0.1:*"))
    try:
        with pytest.raises(ValueError, match="kv_events_config: cannot open 'ipc:///no/such"):
            ZmqEventPublisher(KVEventsConfig(True, "zmq", "ipc:///no/such/dir/x.sock"))
    finally:
        first.shutdown()


def test_an_idle_publisher_sends_empty_batches_in_sequence(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoints: tuple[str, str]
) -> None:
    config = KVEventsConfig(True, "zmq", endpoints[0], topic="kv", heartbeat_seconds=0.1)
    publisher = ZmqEventPublisher(config)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(endpoints[0])
    try:
        frames = [sub.recv_multipart() for _ in range(3) if sub.poll(5000)]
        assert len(frames) == 3  # without a single publish
        seqs = [int.from_bytes(f[1], "big") for f in frames]
        assert seqs == list(range(seqs[0], seqs[0] + 3))
        assert all(DECODER.decode(f[2]).events == [] for f in frames)
        assert publisher.stats().published_batches == 0  # heartbeats are not batches
    finally:
        publisher.shutdown()
        sub.close(linger=0)

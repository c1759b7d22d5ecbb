"""The subscriber: hostile or foreign messages counted and skipped, a late start or a gap
replayed from the engine's replay socket, a restarted publisher clears the index."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest

from hybridkv.kv_events.config import KVEventsConfig
from hybridkv.kv_events.publisher import ZmqEventPublisher
from hybridkv.kv_events.schema import AllBlocksCleared, BlockStored, KVEventBatch
from hybridkv.proxy.routing.index import EngineIndex
from hybridkv.proxy.routing.subscriber import EventSubscriber

ENCODER = msgspec.msgpack.Encoder()


def batch(*hashes: bytes) -> KVEventBatch:
    stored = BlockStored(list(hashes), None, [], 4, None, "GPU", None, group_idx=0)
    return KVEventBatch(time.time(), [stored], 0)


def frame(seq: int, b: KVEventBatch, topic: bytes = b"kv") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), ENCODER.encode(b)]


def subscriber(replay: str | None = None) -> EventSubscriber:
    return EventSubscriber(EngineIndex(100), "ipc:///nowhere", "kv", replay)


@pytest.mark.parametrize(
    "frames, counter",
    [
        ([b"kv", b"\0" * 8], "num_malformed"),  # two frames
        ([b"kv", b"\0" * 3, b""], "num_malformed"),  # a short sequence number
        ([b"kv", b"\0" * 8, b"\x93not msgpack"], "num_malformed"),
        ([b"kv", b"\0" * 8, ENCODER.encode({"ts": "x"})], "num_malformed"),
        ([b"kv", b"\0" * 8, ENCODER.encode([float("nan"), [{"type": "Nope"}]])], "num_malformed"),
        (frame(0, batch(b"a"), topic=b"kv-other"), "num_unknown_publisher"),
        (frame(0, KVEventBatch(1.0, [], 3)), "num_unknown_publisher"),  # another DP rank
    ],
)
def test_bad_messages_are_counted_and_skipped(frames: list[bytes], counter: str) -> None:
    sub = subscriber()
    asyncio.run(sub.receive(frames))
    assert getattr(sub.stats, counter) == 1 and len(sub.index) == 0
    asyncio.run(sub.receive(frame(0, batch(b"a"))))  # and the stream goes on
    assert sub.index.holds("GPU", 0, b"a") and sub.stats.last_seq == 0


def test_a_gap_without_a_replay_socket_is_counted_and_applied() -> None:
    sub = subscriber()
    asyncio.run(sub.receive(frame(0, batch(b"a"))))
    asyncio.run(sub.receive(frame(3, batch(b"d"))))
    assert sub.stats.num_gaps == 2 and sub.stats.num_replay_failures == 1
    assert sub.index.holds("GPU", 0, b"d")


def test_a_restarted_publisher_clears_the_index() -> None:
    sub = subscriber()
    for seq, h in enumerate([b"a", b"b", b"c"]):
        asyncio.run(sub.receive(frame(seq, batch(h))))
    asyncio.run(sub.receive(frame(0, batch(b"new"))))
    assert sub.stats.num_restarts == 1 and len(sub.index) == 1
    assert sub.index.holds("GPU", 0, b"new") and sub.index.stats.num_clears == 1


def test_a_late_start_and_a_gap_are_replayed_in_order(tmp_path: Path) -> None:
    pub_ep, replay_ep = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    publisher = ZmqEventPublisher(KVEventsConfig(True, "zmq", pub_ep, replay_ep, topic="kv"))
    try:
        published = [batch(b"a"), batch(b"b"), KVEventBatch(1.0, [AllBlocksCleared()], 0)]
        published += [batch(b"c"), batch(b"d"), batch(b"e")]
        for b in published:
            publisher.publish(b)
        assert publisher.flush(5.0)

        async def scenario() -> EventSubscriber:
            sub = subscriber(replay_ep)
            await sub.receive(frame(3, published[3]))  # started late: 0..2 replayed first
            await sub.receive(frame(5, published[5]))  # 4 lost: replayed
            return sub

        sub = asyncio.run(scenario())
    finally:
        publisher.shutdown()
    assert sub.stats.num_replays == 2 and sub.stats.num_gaps == 1
    assert sub.stats.last_seq == 5
    held = {h for h in (b"a", b"b", b"c", b"d", b"e") if sub.index.holds("GPU", 0, h)}
    assert held == {b"c", b"d", b"e"}  # a and b were cleared by batch 2, in order


def test_a_stream_of_heartbeats_that_stops_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    sub = subscriber()
    asyncio.run(sub.receive(frame(0, batch(b"a"))))
    assert not sub.is_silent  # no heartbeat seen yet: a publisher that sends none
    asyncio.run(sub.receive(frame(1, KVEventBatch(time.time(), [], 0))))
    assert sub.stats.num_heartbeats == 1 and not sub.is_silent
    monkeypatch.setattr("hybridkv.proxy.routing.subscriber.SILENT_SECONDS", 0.0)
    time.sleep(0.01)
    assert sub.is_silent and sub.index.holds("GPU", 0, b"a")  # kept, but scored cold

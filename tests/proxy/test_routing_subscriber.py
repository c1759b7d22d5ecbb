"""The subscriber: hostile or foreign messages counted and skipped, a late start or a gap
replayed from the engine's replay socket, a restarted publisher clears the index."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest
import zmq
import zmq.asyncio

from hybridkv.kv_events.config import KVEventsConfig
from hybridkv.kv_events.publisher import END_SEQ, ZmqEventPublisher
from hybridkv.kv_events.schema import AllBlocksCleared, BlockStored, KVEventBatch
from hybridkv.proxy.routing.index import EngineIndex
from hybridkv.proxy.routing.subscriber import EventSubscriber

ENCODER = msgspec.msgpack.Encoder()
LONG_REPLAY = 12_000  # batches: past ZMQ's default high-water marks (1,000 a side)


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
    assert not sub.index.holds("GPU", 0, b"a")  # batches 1-2 may have removed it: forgotten


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


def test_a_late_start_after_a_reset_holds_nothing_from_before_it(tmp_path: Path) -> None:
    """Issue 28: a replay longer than the sockets' high-water marks (B7's third policy, the
    engines' buffers ~2,000 batches long) lost its tail, the reset's ``AllBlocksCleared``
    with it, and the blocks stored before the reset stayed in the index."""
    pub_ep, replay_ep = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    config = KVEventsConfig(True, "zmq", pub_ep, replay_ep, topic="kv", buffer_steps=20_000)
    publisher = ZmqEventPublisher(config)
    try:
        for i in range(LONG_REPLAY):
            publisher.publish(batch(i.to_bytes(4, "big")))
        publisher.publish(KVEventBatch(1.0, [AllBlocksCleared()], 0))  # the reset
        live = batch(b"new")
        publisher.publish(live)
        assert publisher.flush(10.0)
        sub = subscriber(replay_ep)
        asyncio.run(sub.receive(frame(LONG_REPLAY + 1, live)))  # a proxy started after it
    finally:
        publisher.shutdown()
    assert sub.stats.num_replays == 1 and sub.stats.num_replay_failures == 0
    assert len(sub.index) == 1 and sub.index.holds("GPU", 0, b"new")


def test_a_long_replay_reaches_a_slow_reader_whole(tmp_path: Path) -> None:
    """The publisher's side of issue 28: its ROUTER sends a whole buffer at once, and past
    the high-water marks ZMQ dropped the tail (the reset, END_SEQ) if the reader lagged."""
    replay_ep = f"ipc://{tmp_path}/replay"
    config = KVEventsConfig(True, "zmq", f"ipc://{tmp_path}/pub", replay_ep, topic="kv",
                            buffer_steps=20_000)  # fmt: skip
    publisher = ZmqEventPublisher(config)
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    try:
        for i in range(LONG_REPLAY):
            publisher.publish(batch(i.to_bytes(4, "big")))
        assert publisher.flush(10.0)
        dealer.connect(replay_ep)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        time.sleep(0.5)  # the publisher answers while nobody reads
        seqs = []
        while dealer.poll(2000) and (frames := dealer.recv_multipart())[2] != END_SEQ:
            seqs.append(int.from_bytes(frames[2], "big"))
        assert frames[2] == END_SEQ and seqs == list(range(LONG_REPLAY))
    finally:
        dealer.close(linger=0)
        ctx.term()
        publisher.shutdown()


async def answer_replay(router: zmq.asyncio.Socket, seqs: list[int], end: bool) -> None:
    """One replay request answered with batches ``seqs`` (one block each, named by its seq),
    then END_SEQ if ``end``: what a publisher whose ROUTER dropped replies sends."""
    client, _, _ = await router.recv_multipart()
    for seq in seqs:
        await router.send_multipart([client, b"", *frame(seq, batch(bytes([seq])))])
    if end:
        await router.send_multipart([client, b"", b"", END_SEQ, b""])


@pytest.mark.parametrize(
    "seqs, end, held, replayed",
    [
        ([1, 2, 3], True, {b"x", b"\1", b"\2", b"\3"}, True),  # the whole gap: applied
        ([2, 3], True, {b"\2", b"\3"}, True),  # the buffer starts after 1: x forgotten
        ([1, 3], True, set(), False),  # a hole (2 may have removed x): all forgotten
        ([1, 2], False, set(), False),  # the tail and END_SEQ lost (issue 28's replay)
    ],
)
def test_a_replay_with_batches_missing_leaves_no_stale_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seqs: list[int], end: bool,
    held: set[bytes], replayed: bool,
) -> None:  # fmt: skip
    monkeypatch.setattr("hybridkv.proxy.routing.subscriber.REPLAY_TIMEOUT_SECONDS", 0.3)
    endpoint = f"ipc://{tmp_path}/replay"

    async def scenario() -> EventSubscriber:
        ctx = zmq.asyncio.Context()
        router = ctx.socket(zmq.ROUTER)
        router.bind(endpoint)
        sub = EventSubscriber(EngineIndex(100), "ipc:///nowhere", "kv", endpoint, ctx)
        await sub.receive(frame(0, batch(b"x")))
        await asyncio.gather(answer_replay(router, seqs, end), sub.receive(frame(4, batch(b"d"))))
        router.close(linger=0)
        ctx.term()
        return sub

    sub = asyncio.run(scenario())
    names = {b"x", b"d"} | {bytes([s]) for s in range(1, 4)}
    assert {h for h in names if sub.index.holds("GPU", 0, h)} == held | {b"d"}
    assert sub.stats.num_replays == int(replayed) and sub.stats.last_seq == 4

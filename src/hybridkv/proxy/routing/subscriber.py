"""``EventSubscriber``: one engine's KV event stream (vLLM's framing) into its ``EngineIndex``.

::

    SUB  [topic, seq (8 bytes big-endian), msgpack KVEventBatch]      (kv_events/publisher.py)

    first batch, seq > 0 (the proxy started late)   replay from 0, then apply
    seq == last + 1                                  apply
    seq >  last + 1 (a gap: dropped by ZMQ's hwm)    counted; replay [last + 1, seq), then apply
    seq <= last (the publisher restarted at 0)       counted; the index is cleared, then as first
    an empty batch (a heartbeat)                     counted; nothing for SILENT_SECONDS after
                                                     one: the engine is scored cold

A replay asks the engine's ROUTER socket (``[b"", start]``, answers until ``END_SEQ``) when
the engine has one; without, the gap is only counted (the index may then be stale until the
keys are stored or removed again). Everything from outside is checked before use: a frame
count, topic, sequence or payload that is not what the publisher sends is counted as
malformed (or, for another topic or data-parallel rank, as an unknown publisher) and
skipped, never fatal. A message is at most ``MAX_MESSAGE_BYTES`` (ZMQ drops the peer).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio

from hybridkv.kv_events.publisher import END_SEQ
from hybridkv.kv_events.schema import KVEventBatch
from hybridkv.proxy.routing.index import EngineIndex

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 << 20
REPLAY_TIMEOUT_SECONDS = 2.0
MAX_REPLAY_BATCHES = 100_000
SILENT_SECONDS = 5.0  # no batch, heartbeat included, for this long: the stream stopped


@dataclass(slots=True)
class SubscriberStats:
    num_malformed: int = 0
    num_unknown_publisher: int = 0
    num_gaps: int = 0  # missing sequence numbers, in batches
    num_replays: int = 0  # replay requests answered
    num_replay_failures: int = 0  # asked and not answered in time (or no replay socket)
    num_restarts: int = 0  # the sequence went back: the engine restarted
    num_heartbeats: int = 0  # empty batches (an idle publisher's, every heartbeat_seconds)
    last_seq: int | None = None
    lag_seconds: float = 0.0  # receive time minus the last batch's ts
    last_batch_at: float | None = None  # monotonic


class EventSubscriber:
    def __init__(
        self,
        index: EngineIndex,
        endpoint: str,
        topic: str = "",
        replay_endpoint: str | None = None,
        ctx: zmq.asyncio.Context | None = None,
    ) -> None:
        self.index = index
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.replay_endpoint = replay_endpoint
        self.ctx = ctx or zmq.asyncio.Context.instance()
        self.stats = SubscriberStats()
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)

    async def run(self) -> None:
        """Receive forever (a task of the proxy's lifespan); the socket closes on cancel."""
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.connect(self.endpoint)
        try:
            while True:
                await self.receive(await sub.recv_multipart())
        finally:
            sub.close(linger=0)

    async def receive(self, frames: list[bytes]) -> None:
        """One message: checked, then applied in sequence order (replaying a gap)."""
        parsed = self._parse(frames)
        if parsed is None:
            return
        seq, batch = parsed
        last = self.stats.last_seq
        if last is not None and seq <= last:
            log.warning("KV events from %s restarted at %d (after %d)", self.endpoint, seq, last)
            self.stats.num_restarts += 1
            self.index.clear()
            last = None
        expected = 0 if last is None else last + 1
        if seq > expected:
            if last is not None:
                self.stats.num_gaps += seq - expected
            await self._replay(expected, seq)
        self._apply(seq, batch)

    def _parse(self, frames: list[bytes]) -> tuple[int, KVEventBatch] | None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self.stats.num_malformed += 1
            return None
        topic, seq_bytes, payload = frames
        if topic != self.topic:
            self.stats.num_unknown_publisher += 1
            return None
        try:
            batch = self._decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.stats.num_malformed += 1
            return None
        if batch.data_parallel_rank not in (None, 0):
            self.stats.num_unknown_publisher += 1  # one engine, one rank (hybridkv's)
            return None
        return int.from_bytes(seq_bytes, "big"), batch

    @property
    def is_silent(self) -> bool:
        """A publisher that sends heartbeats and sent nothing for ``SILENT_SECONDS``: its
        engine is scored cold (its index may be stale). One without heartbeats (vLLM's,
        hybridkv's with ``heartbeat_seconds: 0``) is never silent."""
        last = self.stats.last_batch_at
        return (
            self.stats.num_heartbeats > 0
            and last is not None
            and time.monotonic() - last > SILENT_SECONDS
        )

    def _apply(self, seq: int, batch: KVEventBatch) -> None:
        if not batch.events:
            self.stats.num_heartbeats += 1
        self.index.apply(batch)
        self.stats.last_seq = seq
        now = time.time()
        ts = batch.ts
        self.stats.lag_seconds = max(0.0, now - ts) if 0 < ts < now + 3600 else 0.0
        self.stats.last_batch_at = time.monotonic()

    async def _replay(self, start: int, stop: int) -> None:
        """Apply the engine's buffered batches ``start <= seq < stop``, in order."""
        if self.replay_endpoint is None:
            self.stats.num_replay_failures += 1  # nothing to ask: the gap stays
            return
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        dealer.connect(self.replay_endpoint)
        try:
            await dealer.send_multipart((b"", start.to_bytes(8, "big")))
            if await self._take_replay(dealer, start, stop):
                self.stats.num_replays += 1
            else:
                self.stats.num_replay_failures += 1
        finally:
            with contextlib.suppress(zmq.ZMQError):
                dealer.close(linger=0)

    async def _take_replay(self, dealer: zmq.asyncio.Socket, start: int, stop: int) -> bool:
        """Read replies until END_SEQ; False if none came in time."""
        for _ in range(MAX_REPLAY_BATCHES + 1):
            if not await dealer.poll(int(REPLAY_TIMEOUT_SECONDS * 1000)):
                return False
            frames = await dealer.recv_multipart()
            if len(frames) == 4 and frames[2] == END_SEQ:
                return True
            parsed = self._parse(frames[1:]) if len(frames) == 4 else None
            if parsed is not None and start <= parsed[0] < stop:
                self._apply(parsed[0], parsed[1])
            elif parsed is None and len(frames) != 4:
                self.stats.num_malformed += 1
        return False

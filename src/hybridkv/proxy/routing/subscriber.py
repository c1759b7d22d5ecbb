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
the engine has one. The index never keeps a block the engine may have dropped: a gap that
cannot be filled (no replay socket, no ``END_SEQ`` in time, a hole or a lost tail in the
answer) clears it, and so does an answer that starts after ``start`` (the engine's buffer no
longer reaches back), before the batches it has are applied. Everything from outside is checked before use: a frame
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
        """Apply the engine's buffered batches ``start <= seq < stop``, in order, if they
        reach ``stop - 1`` without a hole; otherwise (or from a buffer that no longer reaches
        back to ``start``) the index is cleared first: a missing batch may have removed a
        block it holds, and a stale block is over-predicted (issue 28)."""
        got = await self._ask_replay(start, stop) if self.replay_endpoint is not None else None
        if got is None or not _reaches(got, stop):
            self.stats.num_replay_failures += 1  # no socket, no answer, or batches lost
            self._forget()
            return
        self.stats.num_replays += 1
        if got[0][0] != start:
            self._forget()
        for seq, batch in got:
            self._apply(seq, batch)

    def _forget(self) -> None:
        """What the index holds may be stale: clear it (the router under-predicts until the
        engine's next events, never over-predicts)."""
        if len(self.index):
            self.index.clear()

    async def _ask_replay(self, start: int, stop: int) -> list[tuple[int, KVEventBatch]] | None:
        assert self.replay_endpoint is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        dealer.connect(self.replay_endpoint)
        try:
            await dealer.send_multipart((b"", start.to_bytes(8, "big")))
            return await self._take_replay(dealer, start, stop)
        finally:
            with contextlib.suppress(zmq.ZMQError):
                dealer.close(linger=0)

    async def _take_replay(
        self, dealer: zmq.asyncio.Socket, start: int, stop: int
    ) -> list[tuple[int, KVEventBatch]] | None:
        """The replies ``start <= seq < stop`` read until END_SEQ, in arrival order; None if
        END_SEQ did not come in time."""
        got: list[tuple[int, KVEventBatch]] = []
        for _ in range(MAX_REPLAY_BATCHES + 1):
            if not await dealer.poll(int(REPLAY_TIMEOUT_SECONDS * 1000)):
                return None
            frames = await dealer.recv_multipart()
            if len(frames) == 4 and frames[2] == END_SEQ:
                return got
            parsed = self._parse(frames[1:]) if len(frames) == 4 else None
            if parsed is not None and start <= parsed[0] < stop:
                got.append(parsed)
            elif parsed is None and len(frames) != 4:
                self.stats.num_malformed += 1
        return None


def _reaches(got: list[tuple[int, KVEventBatch]], stop: int) -> bool:
    """The replayed sequence numbers are consecutive and end at ``stop - 1``
    (a ROUTER socket past its high-water mark drops replies silently: holes, or the tail)."""
    seqs = [seq for seq, _ in got]
    return bool(seqs) and seqs == list(range(seqs[0], stop))

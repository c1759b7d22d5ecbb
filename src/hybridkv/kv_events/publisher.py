"""Publishers of ``KVEventBatch``es: a ZMQ PUB socket fed by a background thread, or nothing.

vLLM's framing, so its subscribers read ours::

    PUB     [topic, seq (8 bytes, big-endian, from 0), msgpack(KVEventBatch)]
    replay  request  [identity, b"", start seq (8 bytes big-endian)]   (a DEALER sends b"", seq)
            replies  [identity, b"", topic, seq, payload] per buffered batch with seq >= start,
                     then [identity, b"", b"", END_SEQ (-1, 8 bytes signed), b""]
                     (the socket's send high-water mark holds all of them: a ROUTER drops
                     what is past it, and a reply lost is a subscriber's stale index)

An idle publisher sends an empty batch every ``heartbeat_seconds`` (1 s; 0: never), with
its own sequence number, so a subscriber tells a quiet engine from a dead stream.

The engine thread only appends to a bounded queue (``publish`` never blocks, never does I/O,
never wakes the thread, which polls); when the publisher thread falls behind the oldest
batches are dropped and counted. The
PUB socket itself drops what no subscriber reads (ZMQ's PUB semantics, up to ``hwm``).

Trust: neither socket authenticates its peers, so whoever reaches them reads what the events
say; both bind loopback unless configured otherwise (``KVEventsConfig``), and a bound address
other hosts can reach is logged as a warning. A replay request frame above 64 bytes drops
its peer (``ZMQ_MAXMSGSIZE``); a start that is not 8 bytes is ignored.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import msgspec
import zmq

from hybridkv.kv_events.config import KVEventsConfig, is_loopback
from hybridkv.kv_events.schema import KVEventBatch
from hybridkv.kv_events.stats import PublisherStats

logger = logging.getLogger(__name__)
END_SEQ = (-1).to_bytes(8, "big", signed=True)
# The thread polls the queue instead of being woken per batch: a wake-up at publish time hands
# the GIL to the thread while the engine thread is in Python (a stall of milliseconds on a
# loaded machine, measured); a poll mostly lands while the engine runs torch kernels.
_POLL_BUSY_SECONDS = 0.01
_POLL_IDLE_SECONDS = 0.05  # after a second without batches
_MAX_REPLAY_REQUEST = 64  # bytes of one frame: a replay request is [b"", 8 bytes]


class EventPublisher(Protocol):
    def publish(self, batch: KVEventBatch) -> None: ...
    @property
    def last_seq(self) -> int: ...
    def set_poll_hook(self, hook: Callable[[], None]) -> None: ...
    def stats(self) -> PublisherStats: ...
    def flush(self, timeout: float) -> bool: ...
    def shutdown(self) -> None: ...


class NullPublisher:
    """``publisher: "null"``: batches are built and counted, nothing is sent."""

    def __init__(self) -> None:
        self._count = 0

    def publish(self, batch: KVEventBatch) -> None:
        self._count += 1

    @property
    def last_seq(self) -> int:
        return self._count - 1

    def set_poll_hook(self, hook: Callable[[], None]) -> None:
        return None  # no thread: batches come from the engine's steps only

    def stats(self) -> PublisherStats:
        return PublisherStats(published_batches=self._count)

    def flush(self, timeout: float) -> bool:
        return True

    def shutdown(self) -> None:
        return None


class ZmqEventPublisher:
    def __init__(
        self, config: KVEventsConfig, context: zmq.Context[zmq.Socket[bytes]] | None = None
    ):
        self.config = config
        self._ctx = context or zmq.Context.instance()
        self._topic = config.topic.encode()
        self._queue: deque[tuple[int, KVEventBatch]] = deque()
        self._next_seq = 0  # given at ``publish`` (engine thread): answers can name it
        self._cond = threading.Condition()
        self._published = 0
        self._dropped = 0
        self._sending = False  # the thread holds batches taken from the queue
        self._stopping = False
        self._poll_hook: Callable[[], None] | None = None
        self._replay_buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._open_sockets()
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ValueError(
                f"kv_events_config: cannot open {config.pub_endpoint!r}: {exc}"
            ) from None
        self._thread = threading.Thread(target=self._run, name="hybridkv-kv-events", daemon=True)
        self._thread.start()

    def _open_sockets(self) -> None:
        """Bind or connect the PUB socket (``KVEventsConfig.binds``), bind the replay socket;
        a bound address other hosts can reach is logged as a warning."""
        config = self.config
        self._pub.set_hwm(config.hwm)
        if config.binds:
            self._pub.bind(config.pub_endpoint)
            _warn_if_reachable(config.pub_endpoint, "the publisher", "every cached block's hash")
        else:
            self._pub.connect(config.pub_endpoint)
        if config.replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.MAXMSGSIZE, _MAX_REPLAY_REQUEST)
            # a ROUTER past its high-water mark drops replies silently: room for a whole
            # answer (the buffer and END_SEQ) per peer, or a long replay loses its tail
            self._replay.setsockopt(zmq.SNDHWM, config.buffer_steps + 1)
            self._replay.bind(config.replay_endpoint)
            history = f"the last {config.buffer_steps} batches"
            _warn_if_reachable(config.replay_endpoint, "the replay socket", history)

    # -- engine thread -------------------------------------------------------------------

    def publish(self, batch: KVEventBatch) -> None:
        """Queue a batch with the next sequence number (drop the oldest queued one if the
        queue is full: a gap a subscriber sees); never blocks."""
        with self._cond:
            if self._stopping:
                return
            if len(self._queue) >= self.config.max_queue_size:
                self._queue.popleft()
                self._dropped += 1
            self._queue.append((self._next_seq, batch))
            self._next_seq += 1

    @property
    def last_seq(self) -> int:
        """The sequence number of the last batch published (-1: none yet)."""
        with self._cond:
            return self._next_seq - 1

    def set_poll_hook(self, hook: Callable[[], None]) -> None:
        """Called on the publisher thread at every poll, before it takes the queue (it may
        ``publish``): how tier events reach subscribers while the engine idles."""
        self._poll_hook = hook

    def stats(self) -> PublisherStats:
        with self._cond:
            return PublisherStats(self._published, self._dropped)

    def flush(self, timeout: float) -> bool:
        """Wait until every queued batch was handed to the socket; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._queue or self._sending), timeout)

    def shutdown(self) -> None:
        """Send what is queued (a second at most), then close the sockets."""
        self.flush(1.0)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=2.0)
        if not self._thread.is_alive():
            self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=500)
        if self._replay is not None:
            self._replay.close(linger=0)

    # -- publisher thread ----------------------------------------------------------------

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        idle, sent_at = 0, time.monotonic()
        while self._sleep(_POLL_BUSY_SECONDS if idle < 100 else _POLL_IDLE_SECONDS):
            self._call_hook()
            beat = self.config.heartbeat_seconds
            batches, num_real = self._take_batches(beat > 0 and time.monotonic() - sent_at >= beat)
            idle = 0 if num_real else idle + 1
            if batches:
                sent_at = time.monotonic()
            for seq, batch in batches:
                payload = encoder.encode(batch)
                try:
                    self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
                except zmq.ZMQError:
                    logger.exception("KV events: publishing batch %d failed", seq)
                self._replay_buffer.append((seq, payload))
            with self._cond:
                self._published += num_real  # heartbeats are not counted
                self._sending = False
                self._cond.notify_all()  # flush() waits for an empty queue
            if self._replay is not None:
                self._serve_replay()

    def _sleep(self, interval: float) -> bool:
        """Wait one poll interval; False once stopping."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopping, interval)
            return not self._stopping

    def _take_batches(self, beat: bool) -> tuple[list[tuple[int, KVEventBatch]], int]:
        """The queued batches; none queued and ``beat``: an idle publisher's empty batch
        (a subscriber sees it is alive, and a gap at the stream's tail shows at once); and
        how many are not heartbeats."""
        with self._cond:
            batches = list(self._queue)
            num_real = len(batches)
            self._queue.clear()
            if not batches and beat:
                empty = KVEventBatch(ts=time.time(), events=[], data_parallel_rank=0)
                batches = [(self._next_seq, empty)]
                self._next_seq += 1
            self._sending = bool(batches)
            return batches, num_real

    def _call_hook(self) -> None:
        if self._poll_hook is None:
            return
        try:
            self._poll_hook()
        except Exception:  # a bug there must not stop the publisher
            logger.exception("KV events: the poll hook failed")

    def _serve_replay(self) -> None:
        assert self._replay is not None
        while self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3:
                logger.warning("KV events: ignoring a replay request of %d frames", len(frames))
                continue
            client, _, start_bytes = frames
            if len(start_bytes) != 8:
                logger.warning("KV events: ignoring a replay request of %d bytes", len(start_bytes))
                continue
            start = int.from_bytes(start_bytes, "big")
            with contextlib.suppress(zmq.ZMQError):
                for seq, payload in list(self._replay_buffer):
                    if seq >= start:
                        self._replay.send_multipart(
                            (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                        )
                self._replay.send_multipart((client, b"", b"", END_SEQ, b""))


def _warn_if_reachable(endpoint: str, socket: str, what: str) -> None:
    if not is_loopback(endpoint):
        logger.warning(
            "KV events: %s bound on %s, reachable from other hosts: anyone who connects gets "
            "%s (and the token ids of unsalted prompts unless omit_token_ids); bind a "
            "loopback address or keep the port on an isolated network",
            socket,
            endpoint,
            what,
        )


def create_publisher(config: KVEventsConfig) -> EventPublisher:
    if config.publisher == "null":
        return NullPublisher()
    return ZmqEventPublisher(config)

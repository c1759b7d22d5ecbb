"""The engine thread: every ``EngineCore`` call happens on it; the event loop talks to it by queue.

::

    event loop (many requests)                       engine thread (one EngineCore)
    submit() --- _Add ---> inbox (locked deque) ---> add_request -> Accepted | Rejected
    abort()  --- _Abort -> inbox ------------------> abort_request (frees its blocks)
    RequestStream.queue <- loop.call_soon_threadsafe - step() outputs, one per request

The thread sleeps on a condition while it has no request and no command (no busy waiting).
After each step it publishes ``engine.stats()`` for /metrics (and logs a line from it every
``LOG_INTERVAL_SECONDS`` while busy). If a step raises, the engine is
dead: every open request gets ``EngineDead`` and new ones are refused (503). While
``max_queued_requests`` requests wait (in the inbox or the scheduler's waiting queue), new ones
are refused with ``Overloaded`` (503 + Retry-After); ``stalled_seconds`` says how long the
current iteration has run (/health fails once it exceeds ``--engine-stall-seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hybridkv.engine.stats import EngineStats, stats_line
from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.server.params import PreparedRequest

if TYPE_CHECKING:
    from hybridkv.engine.core import EngineCore
    from hybridkv.engine.output import RequestOutput

logger = logging.getLogger(__name__)
LOG_INTERVAL_SECONDS = 10.0


class Rejected(Exception):
    """The engine refused the request (``add_request`` raised ValueError); nothing was queued."""


class EngineDead(Exception):
    """The engine thread stopped (a step failed, or the server is shutting down)."""


class Overloaded(Exception):
    """``max_queued_requests`` requests already wait; nothing was queued."""


@dataclass(frozen=True, slots=True)
class Accepted:
    request_id: str


class RequestStream:
    """The event-loop side of one request. Outputs are cumulative, so a reader that falls
    behind skips straight to the newest one."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self.finished = False
        self._loop = loop
        self._queue: asyncio.Queue[RequestOutput | Accepted | Exception] = asyncio.Queue()

    def put(self, item: RequestOutput | Accepted | Exception) -> None:
        """Called on the engine thread."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def wait_accepted(self) -> None:
        item = await self._queue.get()
        if isinstance(item, Exception):
            self.finished = True
            raise item

    async def next_output(self) -> RequestOutput:
        """The newest output; raises ``EngineDead`` if the engine failed."""
        item = await self._queue.get()
        while not self._queue.empty() and not isinstance(item, Exception):
            item = self._queue.get_nowait()
        if isinstance(item, Exception):
            self.finished = True
            raise item
        assert not isinstance(item, Accepted)
        self.finished = item.finished
        return item


@dataclass(frozen=True, slots=True)
class _Add:
    prepared: PreparedRequest
    stream: RequestStream
    arrival: float


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class _Call:
    """Run ``fn(engine)`` on the engine thread between steps (admin calls: a cache reset)."""

    fn: Callable[[EngineCore], Any]
    future: Future[Any]


class AsyncEngine:
    def __init__(
        self, engine: EngineCore, metrics: ServerMetrics, max_queued_requests: int = 1024
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_queued_requests = max_queued_requests
        self.error: str | None = None
        self._num_queued = 0  # adds in the inbox + the scheduler's waiting queue (under _cond)
        self._iteration_start: float | None = None  # set while the engine thread works
        self.num_steps = 0  # steps finished; with in_step, read by /health (engine thread writes)
        self.in_step = False  # inside EngineCore.step()
        self._cond = threading.Condition()
        self._inbox: deque[_Add | _Abort | _Call] = deque()
        self._stopping = False
        self._streams: dict[str, RequestStream] = {}  # engine thread only
        self._needs_flush = False  # an abort's output (and runner cleanup) is still due
        self._last_log = time.monotonic()
        self._logged: EngineStats | None = None  # the snapshot of the last log line
        self._thread = threading.Thread(target=self._run, name="hybridkv-engine", daemon=True)

    # -- event-loop side -----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the engine thread, which shuts the engine down on its way out (connector
        threads joined, buffers and registrations freed); an engine whose thread never
        started is shut down here."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        elif self._thread.ident is None:
            self.engine.shutdown()

    @property
    def is_healthy(self) -> bool:
        return self._thread.is_alive() and self.error is None and not self._stopping

    @property
    def stalled_seconds(self) -> float:
        """How long the engine thread has been in its current iteration (0 while idle)."""
        start = self._iteration_start
        return 0.0 if start is None else time.monotonic() - start

    async def submit(self, prepared: PreparedRequest, request_id: str) -> RequestStream:
        """Queue a request; returns once the engine accepted it, raises ``Rejected`` if not."""
        stream = RequestStream(request_id, asyncio.get_running_loop())
        self._post(_Add(prepared, stream, time.monotonic()))
        try:
            await stream.wait_accepted()
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request (client gone); a no-op if it already finished."""
        with contextlib.suppress(EngineDead):
            self._post(_Abort(request_id))

    async def call(self, fn: Callable[[EngineCore], Any]) -> Any:
        """Run ``fn(engine)`` on the engine thread; its result (or exception)."""
        future: Future[Any] = Future()
        self._post(_Call(fn, future))
        return await asyncio.wrap_future(future)

    def _post(self, command: _Add | _Abort | _Call) -> None:
        with self._cond:
            if self.error is not None or self._stopping:
                raise EngineDead(self.error or "the server is shutting down")
            if isinstance(command, _Add):
                if self._num_queued >= self.max_queued_requests:
                    raise Overloaded(
                        f"the server is overloaded: {self._num_queued} requests are waiting "
                        f"(--max-queued-requests={self.max_queued_requests}); retry later"
                    )
                self._num_queued += 1
            self._inbox.append(command)
            self._cond.notify()

    # -- engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._wait_for_work():
                self._iteration_start = time.monotonic()
                self._handle_inbox()
                if self.engine.has_unfinished_requests() or self._needs_flush:
                    self._step()
                self._publish()
        except Exception as exc:
            logger.exception("engine step failed; the engine is stopped")
            self._fail_all(f"the engine failed: {type(exc).__name__}: {exc}")
        else:
            self._fail_all("the server is shutting down")
        finally:
            self.engine.shutdown()  # connector threads, if any

    def _wait_for_work(self) -> bool:
        """Sleep until there is something to do; False once stopping."""
        with self._cond:
            while not (
                self._stopping
                or self._inbox
                or self._needs_flush
                or self.engine.has_unfinished_requests()
            ):
                self._cond.wait()
            return not self._stopping

    def _publish(self) -> None:
        snapshot = self.engine.stats()
        self.metrics.publish(snapshot)
        now = time.monotonic()
        if now - self._last_log >= LOG_INTERVAL_SECONDS:  # the periodic log line
            logger.info("%s", stats_line(snapshot, self._logged, now - self._last_log))
            self._last_log, self._logged = now, snapshot
        with self._cond:  # the adds still in the inbox, plus the engine's waiting queue
            num_adds = sum(isinstance(c, _Add) for c in self._inbox)
            self._num_queued = num_adds + snapshot.num_waiting
            self._iteration_start = None

    def _handle_inbox(self) -> None:
        with self._cond:
            commands = list(self._inbox)
            self._inbox.clear()
        for command in commands:
            if isinstance(command, _Add):
                self._add(command)
            elif isinstance(command, _Call):
                _run_call(command, self.engine)
            elif command.request_id in self._streams:
                self.engine.abort_request(command.request_id)
                self._needs_flush = True

    def _add(self, command: _Add) -> None:
        p, stream = command.prepared, command.stream
        try:
            self.engine.add_request(
                p.prompt_token_ids, p.params, stream.request_id, p.prompt, cache_salt=p.cache_salt
            )
        except ValueError as exc:
            stream.put(Rejected(str(exc)))
            return
        self._streams[stream.request_id] = stream
        self.metrics.requests.on_arrival(
            stream.request_id, command.arrival, p.params.n, p.params.max_tokens
        )
        stream.put(Accepted(stream.request_id))

    def _step(self) -> None:
        self.in_step = True
        try:
            outputs = self.engine.step()
        finally:
            self.num_steps += 1
            self.in_step = False
        self._needs_flush = False
        now = time.monotonic()
        for out in outputs:
            self.metrics.requests.on_output(out, now)
            stream = self._streams.get(out.request_id)
            if stream is not None:
                stream.put(out)
            if out.finished:
                self._streams.pop(out.request_id, None)

    def _fail_all(self, message: str) -> None:
        with self._cond:
            self.error = self.error or message
            pending = [c.stream for c in self._inbox if isinstance(c, _Add)]
            calls = [c.future for c in self._inbox if isinstance(c, _Call)]
            self._inbox.clear()
        for future in calls:
            future.set_exception(EngineDead(message))
        for stream in [*self._streams.values(), *pending]:
            stream.put(EngineDead(message))
        self._streams.clear()


def _run_call(call: _Call, engine: EngineCore) -> None:
    if not call.future.set_running_or_notify_cancel():
        return
    try:
        call.future.set_result(call.fn(engine))
    except Exception as exc:  # handed to the caller, not fatal to the engine
        call.future.set_exception(exc)

"""``IOPool``: the disk tier's I/O workers -- bounded, ordered per unit, watched for stuck calls.

::

    submit(fn, key) --> queue --> N daemon workers --> fn()
                                     ^   watchdog: a call running past ``timeout`` is stuck:
                                     |   its future fails, ``on_stuck(key)`` quarantines the
                                     '-- unit, and a fresh worker replaces the stuck one

Jobs with the same ``key`` (a unit hash) run one at a time, in submission order (a unit
evicted and stored again is deleted before it is rewritten); other jobs run in parallel. A
call blocked in the kernel cannot be interrupted in Python: the watchdog abandons its thread
(it exits if it ever returns) so other I/O keeps flowing. After ``MAX_ABANDONED`` stuck threads
the disk is treated as gone: every later job fails at once. ``shutdown`` waits at most its
``grace`` for queued work, then fails what is left and joins the workers and the watchdog
until the grace ends (an abandoned thread cannot be joined: it ends if its call ever returns);
workers are daemon threads, so a process exits whatever the disk does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from hybridkv.connectors.threads import join_threads

log = logging.getLogger(__name__)

MAX_ABANDONED = 16


class StuckIO(OSError):
    """An I/O call ran past the pool's timeout (or the pool shut down / gave up on the disk)."""


@dataclass(slots=True, eq=False)
class _Job:
    fn: Callable[[], Any]
    key: Hashable | None
    tag: Hashable | None
    future: Future[Any] = field(default_factory=Future)
    started: float = 0.0
    worker: _Worker | None = None


@dataclass(slots=True, eq=False)
class _Worker:
    abandoned: bool = False
    job: _Job | None = None


class IOPool:
    def __init__(
        self,
        name: str,
        num_workers: int,
        timeout: float,
        on_stuck: Callable[[Hashable | None], None] | None = None,
    ) -> None:
        self.name = name
        self.timeout = timeout
        self.on_stuck = on_stuck
        self.num_stuck = 0  # calls the watchdog gave up on (a gauge of abandoned threads below)
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._busy: set[Hashable] = set()
        self._running: list[_Job] = []
        self._abandoned = 0
        self._closed = False
        self._broken = False
        self._local = threading.local()
        self._threads: list[threading.Thread] = []  # workers and the watchdog, for shutdown
        for _ in range(num_workers):
            self._spawn()
        watchdog = threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True)
        self._threads.append(watchdog)
        watchdog.start()

    def on_worker(self) -> bool:
        """Whether the caller is one of this pool's workers (it must not wait on the pool)."""
        return bool(getattr(self._local, "worker", False))

    def submit(
        self, fn: Callable[[], Any], key: Hashable | None = None, tag: Hashable | None = None
    ) -> Future[Any]:
        """Run ``fn`` on a worker, after the jobs of the same ``key`` queued before it;
        ``tag`` (default: ``key``) is what ``on_stuck`` quarantines if it gets stuck."""
        job = _Job(fn, key, key if tag is None else tag)
        with self._cond:
            if self._closed or self._broken:
                why = "shut down" if self._closed else "disabled after stuck I/O"
                job.future.set_exception(StuckIO(f"{self.name}: {why}"))
                return job.future
            self._queue.append(job)
            self._cond.notify_all()
        return job.future

    def drain(self, timeout: float) -> bool:
        """Wait until nothing is queued or running; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._running, timeout)

    def shutdown(self, grace: float = 2.0) -> None:
        """Refuse new jobs, give queued ones ``grace`` seconds, then fail the rest; join the
        threads until ``grace`` seconds have passed in all."""
        deadline = time.monotonic() + grace
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.drain(grace)
        with self._cond:
            left = [*self._queue, *self._running]
            self._queue.clear()
            self._cond.notify_all()
            threads = [t for t in self._threads if t.is_alive()]
            self._threads = []
        for job in left:
            _fail(job.future, StuckIO(f"{self.name}: shut down"))
        join_threads(threads, max(0.0, deadline - time.monotonic()))

    # -- workers -------------------------------------------------------------------------

    def _spawn(self) -> None:
        worker = _Worker()
        thread = threading.Thread(target=self._run, args=(worker,), name=self.name, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()]  # abandoned ones that ended
        self._threads.append(thread)
        thread.start()

    def _next(self) -> _Job | None:
        """The first queued job whose key is free (under ``_cond``)."""
        for job in self._queue:
            if job.key is None or job.key not in self._busy:
                self._queue.remove(job)
                return job
        return None

    def _run(self, worker: _Worker) -> None:
        self._local.worker = True
        while True:
            with self._cond:
                job = None
                while job is None:
                    if worker.abandoned or (self._closed and not self._queue):
                        return
                    job = self._next()
                    if job is None:
                        self._cond.wait()
                if job.key is not None:
                    self._busy.add(job.key)
                job.started, job.worker, worker.job = time.monotonic(), worker, job
                self._running.append(job)
                if len(self._running) == 1:
                    self._cond.notify_all()  # the watchdog sleeps while nothing runs
            self._call(job)
            with self._cond:
                worker.job = None
                if worker.abandoned:  # the watchdog gave up on this call meanwhile
                    self._abandoned -= 1
                    return
                self._release(job)

    def _call(self, job: _Job) -> None:
        try:
            if not job.future.set_running_or_notify_cancel():
                return
        except RuntimeError:  # failed by ``shutdown`` before it started
            return
        try:
            result = job.fn()
        except BaseException as exc:
            _fail(job.future, exc)
        else:
            with contextlib.suppress(InvalidStateError):
                job.future.set_result(result)

    def _release(self, job: _Job) -> None:
        """A job ended or was abandoned: free its key and wake the others (under ``_cond``)."""
        self._running.remove(job)
        if job.key is not None:
            self._busy.discard(job.key)
        self._cond.notify_all()

    # -- watchdog ------------------------------------------------------------------------

    def _watch(self) -> None:
        period = max(0.01, min(0.25, self.timeout / 4))
        while True:
            with self._cond:  # idle pools cost no wake-ups
                while not self._running and not self._closed:
                    self._cond.wait()
            with self._cond:  # a period, cut short by a shutdown with nothing running
                self._cond.wait_for(lambda: self._closed and not self._running, period)
            now = time.monotonic()
            with self._cond:
                if self._closed and not self._running:
                    return
                stuck = [j for j in self._running if now - j.started > self.timeout]
                for job in stuck:
                    self._abandon(job)
            for job in stuck:
                log.error(
                    "%s: an I/O call ran over %.1f s: abandoned, unit quarantined",
                    self.name,
                    self.timeout,
                )
                _fail(job.future, StuckIO(f"{self.name}: I/O ran over {self.timeout:.1f} s"))
                if self.on_stuck is not None:
                    self.on_stuck(job.tag)

    def _abandon(self, job: _Job) -> None:
        """Give up on a running job's thread and start a replacement (under ``_cond``)."""
        assert job.worker is not None
        job.worker.abandoned = True
        self._abandoned += 1
        self.num_stuck += 1
        self._release(job)
        if self._abandoned > MAX_ABANDONED:
            if not self._broken:
                log.error(
                    "%s: %d I/O calls stuck: the disk tier is disabled", self.name, self._abandoned
                )
            self._broken = True
            for queued in self._queue:
                _fail(queued.future, StuckIO(f"{self.name}: disabled after stuck I/O"))
            self._queue.clear()
        elif not self._closed:
            self._spawn()


def _fail(future: Future[Any], exc: BaseException) -> None:
    with contextlib.suppress(InvalidStateError):
        future.set_exception(exc)

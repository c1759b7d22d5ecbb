"""Waiting on a condition instead of on the clock.

A test that sleeps "long enough" for a thread to act is slow when the machine is quiet and
flaky when it is busy. ``wait_for`` returns as soon as the condition holds and fails, naming
what it waited for, only after a generous ``timeout`` (a hang, not a slow machine); a test
that must show something does *not* happen waits for an event that proves the work it would
have come from is over (a thread joined, a counter moved), never for a fixed time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_SECONDS = 0.005


def wait_for(
    predicate: Callable[[], T], timeout: float = 10.0, *, what: str, every: float = POLL_SECONDS
) -> T:
    """``predicate()``'s first truthy value, polled every ``every`` seconds (a few ms: a cheap
    check; longer for one that costs, like an HTTP call); fails the test with ``timed out
    after N s waiting for <what>`` if none comes within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


class Gate:
    """A stand-in for something slow (a stuck disk, a long tokenization, a busy step): holds
    whoever calls ``hold`` until the test calls ``release`` (or ``limit`` seconds pass).

    ``entered`` is set once a caller is held, so the test waits on that instead of sleeping
    "long enough"; ``num_passed`` counts the callers that got through, so a test shows that
    something did NOT wait for the slow call by finishing while ``num_passed`` is still 0."""

    def __init__(self, limit: float = 30.0) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self.limit = limit
        self.num_passed = 0
        self._lock = threading.Lock()

    def hold(self) -> None:
        self.entered.set()
        self.released.wait(self.limit)
        with self._lock:
            self.num_passed += 1

    def release(self) -> None:
        self.released.set()

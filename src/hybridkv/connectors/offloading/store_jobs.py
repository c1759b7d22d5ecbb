"""Bookkeeping of store jobs that run on a tier's I/O workers (``stores.StorePipeline``).

A job's bookkeeping (abort or commit, unpin, count, release its bytes) must run exactly once,
whether the job ends by itself or its tier gives up on it (a stuck call the watchdog
abandoned, a pool shut down): ``Once`` decides which; ``on_tier`` wires both ends.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future
from typing import Any

from hybridkv.connectors.offloading.tier_base import Tier
from hybridkv.kv.hashing import BlockHash

STALL_SECONDS = 5.0  # ``wait_for_saves`` gives up when no store ended for this long


class Once:
    """Whichever comes first of a job's own end and its tier giving up on it (stuck, shut
    down) does the job's bookkeeping; the other does nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claimed = False

    def claim(self) -> bool:
        with self._lock:
            first, self._claimed = not self._claimed, True
            return first


def on_tier(tier: Tier, job: Any, key: BlockHash, given_up: Any) -> None:
    """Run ``job(once)`` on the tier's I/O; ``given_up()`` instead if the tier fails it (stuck,
    shut down) before the job claimed its bookkeeping."""
    once = Once()
    future = tier.submit(functools.partial(job, once), key)

    def check(done: Future[Any]) -> None:
        if done.exception() is not None and once.claim():
            given_up()

    future.add_done_callback(check)


class Countdown:
    """Runs ``done`` when the last of ``count`` write-behinds of one store ended."""

    def __init__(self, count: int, done: Any) -> None:
        self._lock = threading.Lock()
        self._left = count
        self._done = done

    def tick(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._done()

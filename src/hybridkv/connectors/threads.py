"""Stopping a connector's thread pools within a bound.

``ThreadPoolExecutor.shutdown(wait=True)`` waits for a call that may never return (a read of
a file on a stuck mount); ``wait=False`` returns at once but leaves its threads running after
the engine is gone. ``stop_pool`` takes the middle: cancel what has not started, then join
the pool's threads until a deadline, and say which ones did not end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 2.0  # how long a shutdown waits for a thread still in a call


def stop_pool(pool: ThreadPoolExecutor, timeout: float) -> bool:
    """Cancel ``pool``'s queued calls and join its threads for up to ``timeout`` seconds;
    True if every thread ended (a thread still in a call then ends when the call returns)."""
    pool.shutdown(wait=False, cancel_futures=True)
    # NOTE: ``_threads`` is CPython's (stable since 3.2); the pool offers no public join
    threads: set[threading.Thread] = getattr(pool, "_threads", set())
    return join_threads(threads, timeout)


def join_threads(threads: Iterable[threading.Thread], timeout: float) -> bool:
    """Join ``threads`` until ``timeout`` seconds from now in all; False (and a warning
    naming them) if some are still running then."""
    deadline = time.monotonic() + timeout
    current = threading.current_thread()
    left = []
    for thread in list(threads):
        if thread is current:
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            left.append(thread.name)
    if left:
        log.warning("%d thread(s) still running after %.1f s: %s", len(left), timeout, left)
    return not left

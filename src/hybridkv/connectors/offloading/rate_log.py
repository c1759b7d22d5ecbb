"""``RateLimitedLog``: failures that repeat (a full disk, a dying device) are logged at most
once per interval, with how many were not logged since; counters count every one."""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("hybridkv.connectors.offloading")

EVERY_SECONDS = 60.0


class RateLimitedLog:
    def __init__(self, what: str, every: float = EVERY_SECONDS) -> None:
        self.what = what
        self.every = every
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._skipped = 0

    def warn(self, message: str) -> bool:
        """Log ``message`` unless one was logged less than ``every`` seconds ago; whether it
        was logged."""
        now = time.monotonic()
        with self._lock:
            if now - self._last < self.every:
                self._skipped += 1
                return False
            skipped, self._skipped, self._last = self._skipped, 0, now
        more = f" ({skipped} more since the last message)" if skipped else ""
        log.warning("%s: %s%s", self.what, message, more)
        return True

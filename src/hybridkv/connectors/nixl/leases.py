"""A producer's leases: a finished request's KV waits for its consumer's notification
(``"<request id>:<bytes read>"``), or until ``abort_timeout_seconds`` pass; either way the
request is reported in ``finished_sending`` and the scheduler frees its blocks. A consumer's
heartbeat (``heartbeats``: its request still waits there) for a held lease extends its deadline
to ``max(deadline, now + abort_timeout_seconds)``; heartbeats for unknown or ended leases are
ignored (counted as unmatched).

A late reader must never use freed (possibly reused) blocks. Each lease owns a word of a
registered ``uint64`` array: the producer writes its generation ``gen`` (unique, increasing)
when the lease starts and ``gen | ENDED`` when it ends, *before* reporting the request (so
before any block is freed). A consumer reads the word after its data read completed (and
sends its notification only with that second read): ``lease_valid`` (exactly ``word == gen``)
says whether the lease still held then, which means it held during the whole data read;
``lease_pending`` (an older lease's value) that it has not started on the producer's worker yet
(the consumer reads the word again).

A notification may arrive before its lease starts (the consumer was faster than the producer's
next step): it waits in a table bounded in size (``EARLY_LIMIT``, oldest dropped first) and
age (``EARLY_SECONDS``); a notification is at most ``MAX_NOTIFICATION`` bytes of
``"<request id>:<ASCII digits>"``, anything else is counted unmatched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from hybridkv.connectors.nixl.heartbeats import parse_heartbeat
from hybridkv.connectors.nixl.meta import Lease
from hybridkv.connectors.nixl.stats import Flow, NixlStats
from hybridkv.connectors.stats import StatsCounter, bump

log = logging.getLogger(__name__)

EARLY_LIMIT = 4096  # notifications kept for requests whose lease has not started (yet)
EARLY_SECONDS = 60.0  # ... for at most this long (a lease starts one producer step later)
MAX_NOTIFICATION = 512  # bytes of a read notification (request ids are short)
ENDED = 1 << 63


def lease_valid(word: int, gen: int) -> bool:
    """Whether lease ``gen`` held when its word read ``word``: exactly its own value."""
    return word == gen


def lease_pending(word: int, gen: int) -> bool:
    """Whether ``word`` is an older lease's value (active or ended): lease ``gen`` has not
    started on the producer's worker yet (its KV is held from the request's end); read the
    word again. Ended, or a newer lease: neither valid nor pending."""
    return (word & ~ENDED) < gen


class Leases:
    def __init__(
        self,
        stats: StatsCounter[NixlStats],
        words: np.ndarray,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stats = stats
        self.words = words  # registered uint64 lease words
        self.clock = clock
        self.deadlines: dict[str, float] = {}  # request id -> deadline (0: read, report now)
        self._held: dict[str, Lease] = {}
        self._seconds: dict[str, float] = {}  # request id -> its lease's duration
        # request id -> (bytes read, when), before its lease started; oldest first
        self._early: dict[str, tuple[int, float]] = {}

    def start(self, request_id: str, seconds: float, lease: Lease) -> None:
        self._held[request_id] = lease
        self._seconds[request_id] = seconds
        self.words[lease.slot] = lease.gen
        if request_id in self._early:  # the consumer was faster than our step
            self._count(self._early.pop(request_id)[0])
            self.deadlines[request_id] = 0.0
            return
        self.deadlines[request_id] = self.clock() + seconds

    def on_notifications(self, messages: list[bytes]) -> bool:
        """Digest consumers' notifications (reads and heartbeats); True if one completed a
        lease."""
        found = False
        for message in messages:
            if self._heartbeat_message(message):
                continue
            parsed = parse_notification(message)
            if parsed is None:
                with self.stats.update() as s:
                    s.notifications_unmatched += 1
                continue
            rid, n = parsed
            if rid in self.deadlines:
                self.deadlines[rid] = 0.0
                self._count(n)
                found = True
            else:
                self._keep_early(rid, n)
        return found

    def _keep_early(self, rid: str, nbytes: int) -> None:
        """Keep a notification whose lease has not started (bounded: see the module)."""
        self._expire_early()
        if len(self._early) >= EARLY_LIMIT:
            del self._early[next(iter(self._early))]
            with self.stats.update() as s:
                s.notifications_unmatched += 1
        self._early.pop(rid, None)
        self._early[rid] = (nbytes, self.clock())

    def _expire_early(self) -> None:
        oldest = self.clock() - EARLY_SECONDS
        while self._early:
            rid, (_, when) = next(iter(self._early.items()))
            if when >= oldest:
                return
            del self._early[rid]
            with self.stats.update() as s:
                s.notifications_unmatched += 1

    def _heartbeat_message(self, message: bytes) -> bool:
        """Digest ``message`` if it is a heartbeat (a malformed one counts as one unmatched)."""
        try:
            ids = parse_heartbeat(message)
        except ValueError as exc:
            log.warning("NIXL: %s", exc)
            with self.stats.update() as s:
                s.heartbeats_received += 1
                s.heartbeats_unmatched += 1
            return True
        if ids is None:
            return False
        self.heartbeat(ids)
        return True

    def heartbeat(self, request_ids: list[str]) -> None:
        """Consumers still wait to read these requests: extend their held leases."""
        now, matched = self.clock(), 0
        for rid in request_ids:
            deadline = self.deadlines.get(rid)
            if deadline:  # held and not read yet (0.0: read, reported at the next step)
                self.deadlines[rid] = max(deadline, now + self._seconds[rid])
                matched += 1
        with self.stats.update() as s:
            s.heartbeats_received += len(request_ids)
            s.heartbeats_unmatched += len(request_ids) - matched

    def _count(self, nbytes: int) -> None:
        with self.stats.update() as s:
            bump(s.nbytes, Flow.SEND, nbytes)
            bump(s.transfers, Flow.SEND)

    def take_finished(self) -> set[str]:
        """Requests read (or whose lease expired) since the last call."""
        self._expire_early()
        now = self.clock()
        done = {rid for rid, deadline in self.deadlines.items() if deadline <= now}
        for rid in done:
            lease = self._held.pop(rid)
            self._seconds.pop(rid, None)
            self.words[lease.slot] = lease.gen | ENDED  # before any of its blocks is freed
            if self.deadlines.pop(rid) > 0.0:
                with self.stats.update() as s:
                    s.leases_expired += 1
                log.warning("NIXL: request %s was never read; lease expired, KV freed", rid)
        return done


def parse_notification(message: bytes) -> tuple[str, int] | None:
    """``"<request id>:<bytes read>"`` -> (id, bytes); None if ``message`` is not one."""
    if len(message) > MAX_NOTIFICATION:
        return None
    rid, sep, nbytes = message.decode(errors="replace").rpartition(":")
    if not sep or not rid or not (nbytes.isascii() and nbytes.isdigit()) or len(nbytes) > 18:
        return None
    return rid, int(nbytes)

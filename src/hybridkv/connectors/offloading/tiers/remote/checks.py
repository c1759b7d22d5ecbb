"""What the remote tier asks the server before a lookup answers: probes and confirmations.

Both run on one probe worker (one pipelined ``EXISTS`` over every value of each unit, one round
trip per batch) and answer the scheduler thread at once: ``ASKING`` / ``None`` meanwhile (the
scheduler says "ask again"; the worker's ``progress`` wakes the engine when the answer is in).

- **Probes**: units no tier indexes, which another process may have stored. Complete ones are
  handed to ``take_found`` (adopted in ``build_connector_meta``); a unit found incomplete is not
  probed again for ``PROBE_RETRY_SECONDS``.
- **Confirmations**: units this tier indexes (READY) that a lookup is about to report. The
  server may have evicted a value since (``allkeys-lru``), so a lookup reports such a unit only
  if it was seen complete within ``CONFIRM_SECONDS``, or by the check this lookup itself asked
  for (so a slow step never makes the lookup ask forever). A unit found incomplete leaves the
  index there and then (on the scheduler thread) and the lookup reports the run before it:
  nothing is loaded and failed that the server had already lost. Its remaining values are left
  to the server's eviction (another process may be writing that unit right now).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from hybridkv.connectors.offloading.tier import TierIndex
from hybridkv.connectors.offloading.tier_base import ProbeAnswer, UnitRef
from hybridkv.kv.hashing import BlockHash

PROBE_RETRY_SECONDS = 1.0  # a unit found absent is not probed again sooner
CONFIRM_SECONDS = 0.5  # a unit seen complete this recently is reported without asking again
MAX_PROBE_UNITS = 64  # units checked in one probe round trip
_MAX_REMEMBERED = 4096


@dataclass(slots=True)
class _Seen:
    at: float  # when the unit was seen complete
    fresh: bool  # asked for by a lookup that has not used the answer yet


class RemoteChecks:
    """Probes and confirmations of one remote tier. ``count_keys`` runs one pipelined round
    trip (one ``EXISTS`` per unit, over all its values) and returns, per unit, how many of its
    values exist and how many it has; it raises if the server cannot answer."""

    def __init__(
        self,
        index: TierIndex,
        count_keys: Callable[[Sequence[UnitRef]], list[tuple[int, int]]],
        clock: Callable[[], float],
        is_down: Callable[[], bool],
        progress: Callable[[], None],
    ) -> None:
        self.index = index
        self.count_keys = count_keys
        self.clock = clock
        self.is_down = is_down
        self.progress = progress  # an answer came in (wakes a waiting engine)
        self.counts: dict[str, float] = {}  # under ``_lock``, drained by the tier
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="offload-remote-probe")
        self._lock = threading.Lock()
        self._asking: set[BlockHash] = set()
        self._found: dict[BlockHash, UnitRef] = {}
        self._absent: dict[BlockHash, float] = {}
        self._seen: dict[BlockHash, _Seen] = {}
        # indexed units a confirmation did not find whole: True if a value is gone (the unit
        # leaves the index), False if the server did not answer (reported neither)
        self._gone: dict[BlockHash, bool] = {}

    # -- scheduler thread ----------------------------------------------------------------

    def probe(self, units: Sequence[UnitRef]) -> ProbeAnswer:
        first = units[0].unit_hash
        now = self.clock()
        with self._lock:
            if first in self._found:
                return ProbeAnswer.FOUND
            if first in self._asking:
                return ProbeAnswer.ASKING
            if self._absent.get(first, now) > now or self.is_down():
                return ProbeAnswer.ABSENT
            todo = [
                u
                for u in units[:MAX_PROBE_UNITS]
                if u.unit_hash not in self._asking
                and self.index.get(u.unit_hash) is None
                and self._absent.get(u.unit_hash, now) <= now
            ]
            self._ask(todo, confirming=False)
        return ProbeAnswer.ASKING

    def confirm(self, units: Sequence[UnitRef]) -> int | None:
        """How many of ``units`` (indexed READY here, a lookup's run in order) are still
        complete on the server; None while asking. A server down confirms none."""
        if self.is_down():
            return 0
        now = self.clock()
        with self._lock:
            cut = next((i for i, u in enumerate(units) if u.unit_hash in self._gone), len(units))
            for unit in units[cut:]:
                if self._gone.pop(unit.unit_hash, False):
                    self.index.remove(unit.unit_hash)  # memory only: the scheduler's to do
                    self._absent[unit.unit_hash] = now + PROBE_RETRY_SECONDS
                    self.counts["confirm_missing"] = self.counts.get("confirm_missing", 0) + 1
            todo = [u for u in units[:cut] if not self._usable(u.unit_hash, now)]
            if todo:
                self._ask([u for u in todo if u.unit_hash not in self._asking], confirming=True)
                return None
            for unit in units[:cut]:
                self._seen[unit.unit_hash].fresh = False
        return cut

    def _usable(self, unit_hash: BlockHash, now: float) -> bool:
        seen = self._seen.get(unit_hash)
        return seen is not None and (seen.fresh or now - seen.at < CONFIRM_SECONDS)

    def seen_complete(self, unit_hash: BlockHash) -> None:
        """This process just wrote the unit whole (a write counts as a confirmation)."""
        with self._lock:
            self._seen[unit_hash] = _Seen(self.clock(), False)

    def take_found(self) -> list[UnitRef]:
        with self._lock:
            found, self._found = self._found, {}
        return list(found.values())

    def mark_absent(self, unit_hash: BlockHash) -> None:
        with self._lock:
            self._absent[unit_hash] = self.clock() + PROBE_RETRY_SECONDS

    def probing(self) -> bool:
        with self._lock:
            return bool(self._asking)

    # -- the probe worker ----------------------------------------------------------------

    def _ask(self, units: list[UnitRef], confirming: bool) -> None:
        """Under ``_lock``: check ``units`` on the worker."""
        if units:
            self._asking.update(u.unit_hash for u in units)
            self._worker.submit(self._check, units, confirming)

    def _check(self, units: list[UnitRef], confirming: bool) -> None:
        try:
            counts: list[tuple[int, int]] | None = self.count_keys(units)
        except Exception:  # never leave units "asking"  # noqa: BLE001
            counts = None
        now = self.clock()
        with self._lock:
            for i, unit in enumerate(units):
                h = unit.unit_hash
                self._asking.discard(h)
                complete = counts is not None and counts[i][0] == counts[i][1]
                if complete:
                    self._seen[h] = _Seen(now, True)
                    if not confirming:
                        self._found[h] = unit
                elif confirming:  # a server that cannot answer confirms nothing either
                    self._gone[h] = counts is not None
                else:
                    self._absent[h] = now + PROBE_RETRY_SECONDS
            self._forget_old(now)
        self.progress()

    def _forget_old(self, now: float) -> None:
        if len(self._absent) > _MAX_REMEMBERED:
            self._absent = {h: t for h, t in self._absent.items() if t > now}
        if len(self._seen) > _MAX_REMEMBERED:
            self._seen = {h: s for h, s in self._seen.items() if now - s.at < CONFIRM_SECONDS}

    def take_counts(self) -> dict[str, Any]:
        with self._lock:
            counts, self.counts = self.counts, {}
        return counts

    def shutdown(self) -> None:
        self._worker.shutdown(wait=True)

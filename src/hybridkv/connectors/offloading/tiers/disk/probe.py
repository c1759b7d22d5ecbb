"""Probes of the disk tier: units another process sharing the directory wrote.

``DiskProbing`` is a base of ``DiskTier`` holding the ``Tier`` probe contract for disk:
``probe`` checks on the I/O pool that every part of a unit is on disk with an authenticated
header (``check_part``), waiting at most ``PROBE_WAIT_SECONDS``, else answering ``ASKING``;
found units wait in ``_found`` until the scheduler half adopts them (``take_found``); a unit
found absent (or being deleted, or quarantined) is not probed again for
``PROBE_RETRY_SECONDS``. The probe state (``_found``, ``_absent``, ``_probing``) is guarded by
``_lock``; nothing here touches a file on the scheduler thread.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Sequence

from hybridkv.connectors.offloading.tier_base import ProbeAnswer, UnitRef
from hybridkv.connectors.offloading.tiers.disk import scan as disk_scan
from hybridkv.connectors.offloading.tiers.disk.format import (
    PartError,
    open_regular,
    parse_header,
)
from hybridkv.connectors.offloading.tiers.disk.io import IOPool
from hybridkv.connectors.offloading.tiers.disk.key import DirectoryKey
from hybridkv.connectors.offloading.units import UnitGeometry, part_key
from hybridkv.kv.hashing import BlockHash

PROBE_RETRY_SECONDS = 1.0  # a unit probed and found absent is not probed again sooner
PROBE_WAIT_SECONDS = 0.01  # the scheduler waits at most this long for a probe's answer
MAX_ABSENT = 4096  # remembered absent units before the expired ones are forgotten


class DiskProbing:
    """The probe half of ``DiskTier`` (see the module docstring); ``DiskTier`` sets the
    attributes below in its constructor."""

    fingerprint: str
    geometry: UnitGeometry
    key: DirectoryKey
    pool: IOPool
    clock: Callable[[], float]
    probe_wait: float
    _lock: threading.Lock
    _found: dict[BlockHash, tuple[int, BlockHash | None]]
    _absent: dict[BlockHash, float]
    _probing: set[BlockHash]
    _deleting: dict[BlockHash, int]
    quarantined: set[BlockHash]

    def path(self, unit_hash: BlockHash, group_id: int) -> str:
        raise NotImplementedError

    def _hook(self, op: str, path: str) -> None:
        raise NotImplementedError

    def probe(self, units: Sequence[UnitRef]) -> ProbeAnswer:
        """Whether ``units[0]`` is complete on disk, checked on the pool: FOUND (adopted at
        ``take_found``), ABSENT (not probed again for ``PROBE_RETRY_SECONDS``), or ASKING
        while the check runs. Waits at most ``PROBE_WAIT_SECONDS``, and not at all while
        another probe is outstanding (the disk is slow)."""
        unit = units[0]
        with self._lock:
            answer = self._known(unit.unit_hash)
            if answer is not None:
                return answer
            wait = not self._probing
            self._probing.add(unit.unit_hash)
        future = self.pool.submit(functools.partial(self._probe_job, unit), tag=unit.unit_hash)
        if wait:
            with contextlib.suppress(Exception):
                future.result(timeout=self.probe_wait)
        with self._lock:
            return self._known(unit.unit_hash) or ProbeAnswer.ASKING

    def _known(self, unit_hash: BlockHash) -> ProbeAnswer | None:
        """What the probe state says of a unit now (under ``_lock``)."""
        if unit_hash in self._found:
            return ProbeAnswer.FOUND
        if unit_hash in self._probing:
            return ProbeAnswer.ASKING
        now = self.clock()
        if self._absent.get(unit_hash, now) > now:
            return ProbeAnswer.ABSENT
        if unit_hash in self._deleting or unit_hash in self.quarantined:
            self._mark_absent(unit_hash, now)
            return ProbeAnswer.ABSENT
        return None

    def _probe_job(self, unit: UnitRef) -> None:
        complete = False
        try:
            complete = self._parts_on_disk(unit.unit_hash, unit.end)
        finally:
            with self._lock:
                self._probing.discard(unit.unit_hash)
                if complete and unit.unit_hash not in self.quarantined:
                    self._found[unit.unit_hash] = (unit.end, unit.parent)
                else:
                    self._mark_absent(unit.unit_hash, self.clock())

    def take_found(self) -> list[UnitRef]:
        """The units probed complete since the last call, in the order they were found."""
        with self._lock:
            found, self._found = self._found, {}
        return [UnitRef(unit_hash, end, parent) for unit_hash, (end, parent) in found.items()]

    def mark_absent(self, unit_hash: BlockHash) -> None:
        """Do not probe the unit again for ``PROBE_RETRY_SECONDS``."""
        with self._lock:
            self._mark_absent(unit_hash, self.clock())

    def _mark_absent(self, unit_hash: BlockHash, now: float) -> None:
        if len(self._absent) >= MAX_ABSENT:
            self._absent = {h: t for h, t in self._absent.items() if t > now}
        self._absent[unit_hash] = now + PROBE_RETRY_SECONDS

    def _parts_on_disk(self, unit_hash: BlockHash, end: int) -> bool:
        for group in self.geometry.layout.groups:
            path = self.path(unit_hash, group.group_id)
            self._hook("probe", path)
            try:
                found = self.check_part(path, part_key(unit_hash, group.group_id))
                if found is None or found[2] != end:
                    return False
            except PartError:
                return False
        return True

    def check_part(self, path: str, key: str | None) -> tuple[BlockHash, int, int] | None:
        """(unit hash, group, end) of the authenticated part at ``path`` if it is ours
        (fingerprint, ``key`` if given) with the span and size this layout expects; else
        None. Reads the header only; ``PartError`` if it cannot be read or is refused."""
        fd, size = open_regular(path)
        try:
            head = parse_header(self.key, fd, size)
        finally:
            os.close(fd)
        if head.fingerprint != self.fingerprint or (key is not None and head.key != key):
            return None
        unit_hash, group_id = disk_scan.parse_key(head.key)
        end = head.span[1]
        ok = (
            unit_hash is not None
            and 0 <= group_id < len(self.geometry.layout.groups)
            and end > 0
            and end % self.geometry.chunk_tokens == 0
            and head.span == self.geometry.part_span(group_id, end)
            and head.payload_len == self.geometry.part_nbytes(group_id, end)
            and os.path.basename(path) == self.key.file_name(head.key)
        )
        return (unit_hash, group_id, end) if ok and unit_hash is not None else None

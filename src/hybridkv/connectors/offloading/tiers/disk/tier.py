"""The disk tier: one authenticated file per unit part (``tiers.disk.format``, version 3).

::

    <disk_path>/.hybridkv-key                       the directory's secret (0600)
    <disk_path>/<fingerprint>/c<chunk_tokens>/      0700, with ``budget`` (disk_bytes it had)
        <name[:2]>/<name>                           name = keyed hash of "<unit hash>.g<group>"

Nothing here touches a file on the scheduler thread: lookups read the index; ``probe`` hands
the file checks to the I/O pool (``tiers.disk.io.IOPool``: bounded, ordered per unit, watched) and
waits at most ``PROBE_WAIT_SECONDS`` for the answer, else answers ``ASKING``. Reads from load
threads run on the pool too, so a stuck disk costs a load its timeout, never a thread; a call
the watchdog gives up on quarantines its unit (out of the index, never adopted again by this
process). Writes and deletions of one unit run in order on the pool.

Other processes may share the directory (same key file): a unit another process stored is
found by ``probe`` and adopted by the scheduler half in ``build_connector_meta``
(``take_found``), where reservations may evict. A unit found absent is not probed again for
``PROBE_RETRY_SECONDS``. Start-up indexing is ``tiers.disk.scan``'s.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, TimeoutError
from typing import Any

import torch

from hybridkv.connectors.config import TierName
from hybridkv.connectors.offloading.policies import Eviction, create_policy
from hybridkv.connectors.offloading.tier import ResidentUnit, TierIndex
from hybridkv.connectors.offloading.tier_base import Tier, TierCounts, UnitRef
from hybridkv.connectors.offloading.tiers.disk import scan as disk_scan
from hybridkv.connectors.offloading.tiers.disk.format import (
    IO_ERROR,
    MISSING,
    UNSAFE,
    PartError,
    read_verified,
    write_verified,
)
from hybridkv.connectors.offloading.tiers.disk.io import IOPool, StuckIO
from hybridkv.connectors.offloading.tiers.disk.key import DirectoryKey
from hybridkv.connectors.offloading.tiers.disk.probe import PROBE_WAIT_SECONDS, DiskProbing
from hybridkv.connectors.offloading.units import UnitGeometry, part_key
from hybridkv.kv.hashing import BlockHash
from hybridkv.step_io import FailureReason

TIMEOUT = FailureReason.TIMEOUT

NUM_IO_WORKERS = 4


class DiskTier(DiskProbing, Tier):
    """Bytes, deletions and quarantine here; probes and adoption in ``DiskProbing``
    (``tiers.disk.probe.py``)."""

    name = TierName.DISK
    removed_counter = "files_removed"

    def __init__(
        self,
        root: str,
        fingerprint: str,
        capacity: int,
        eviction: Eviction,
        geometry: UnitGeometry,
        io_timeout: float = 30.0,
    ) -> None:
        self.fingerprint = fingerprint
        self.geometry = geometry
        self.directory = os.path.join(root, fingerprint, f"c{geometry.chunk_tokens}")
        disk_scan.make_private_dirs(root, self.directory)
        self.key = DirectoryKey.load_or_create(root)
        unit_bytes = max(1, geometry.unit_nbytes(geometry.chunk_tokens * 2))
        self.index = TierIndex("disk", capacity, create_policy(eviction, capacity // unit_bytes))
        self.io_timeout = io_timeout
        self.pool = IOPool("offload-disk", NUM_IO_WORKERS, io_timeout, self._quarantine)
        self.counters = TierCounts()
        self.clock: Callable[[], float] = time.monotonic
        self.probe_wait = PROBE_WAIT_SECONDS
        # tests only: called as fault(op, path) before each file operation on the pool
        self.fault: Callable[[str, str], None] | None = None
        self._lock = threading.Lock()  # the probe state and the sets below
        self._found: dict[BlockHash, tuple[int, BlockHash | None]] = {}
        self._absent: dict[BlockHash, float] = {}
        self._probing: set[BlockHash] = set()
        self._deleting: dict[BlockHash, int] = {}  # evictions queued (never adopted back)
        self.quarantined: set[BlockHash] = set()
        self.num_removed_at_startup = 0
        disk_scan.rebuild_index(self)

    def path(self, unit_hash: BlockHash, group_id: int) -> str:
        name = self.key.file_name(part_key(unit_hash, group_id))
        return os.path.join(self.directory, name[:2], name)

    def part_paths(self, unit_hash: BlockHash) -> dict[int, str]:
        """Group id -> file of every part of a unit (an index entry's ``parts``)."""
        return {g.group_id: self.path(unit_hash, g.group_id) for g in self.geometry.layout.groups}

    def adopted_parts(self, unit: UnitRef) -> dict[int, Any]:
        return dict(self.part_paths(unit.unit_hash))

    def _hook(self, op: str, path: str) -> None:
        if self.fault is not None:
            self.fault(op, path)

    # -- bytes (I/O pool) ----------------------------------------------------------------

    def write(self, unit_hash: BlockHash, end: int, parts: dict[int, Any]) -> int:
        """Write every part of a reserved unit and commit it; returns the bytes written. On
        any failure the unit's files are removed and the error propagates (the caller aborts
        the reservation, counts and logs it)."""
        written: list[str] = []
        total = 0
        try:
            if unit_hash in self.quarantined:
                raise StuckIO(f"unit {unit_hash.hex()} is quarantined")
            for gid, data in parts.items():
                path = self.path(unit_hash, gid)
                self._hook("write", path)
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                payload = memoryview(data.contiguous().numpy())
                span = self.geometry.part_span(gid, end)
                key = part_key(unit_hash, gid)
                total += write_verified(self.key, path, self.fingerprint, key, span, payload)
                written.append(path)
        except BaseException:  # logged and counted by the caller (``stores``)
            for path in written:
                _unlink(path)
            raise
        if not self.index.commit(unit_hash, self.part_paths(unit_hash)):
            for path in written:  # the reservation was dropped meanwhile
                _unlink(path)
        return total

    def read(
        self, unit_hash: BlockHash, end: int, group_id: int, deadline: float | None = None
    ) -> torch.Tensor:
        """Read and verify one part on the I/O pool; ``PartError`` with the reason otherwise
        (``io_error`` when the disk does not answer within the tier's timeout, ``timeout`` when
        the load's ``deadline`` passes first; the pool's watchdog then handles the call)."""
        if self.pool.on_worker():
            return self._read_now(unit_hash, end, group_id)
        wait = 2 * self.io_timeout + 1
        if deadline is not None:
            wait = min(wait, deadline - time.monotonic())
            if wait <= 0:
                raise PartError(TIMEOUT, "the load's deadline passed")
        job = functools.partial(self._read_now, unit_hash, end, group_id)
        future = self.pool.submit(job, tag=unit_hash)
        try:
            result: torch.Tensor = future.result(timeout=wait)
        except StuckIO as exc:
            raise PartError(IO_ERROR, str(exc) or "stuck") from None
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise PartError(TIMEOUT, "the load's deadline passed") from None
            raise PartError(IO_ERROR, "stuck") from None
        return result

    def _read_now(self, unit_hash: BlockHash, end: int, group_id: int) -> torch.Tensor:
        if unit_hash in self.quarantined:
            raise PartError(IO_ERROR, f"unit {unit_hash.hex()} is quarantined")
        path = self.path(unit_hash, group_id)
        self._hook("read", path)
        key = part_key(unit_hash, group_id)
        span = self.geometry.part_span(group_id, end)
        nbytes = self.geometry.part_nbytes(group_id, end)
        payload = read_verified(self.key, path, self.fingerprint, key, span, nbytes)
        return torch.frombuffer(payload, dtype=torch.uint8)  # [nbytes], shares the read buffer

    def remove_files(self, unit_hash: BlockHash) -> int:
        """Delete a unit's files now (never following a symlink); returns how many existed."""
        removed = 0
        for group in self.geometry.layout.groups:
            with contextlib.suppress(OSError):
                os.unlink(self.path(unit_hash, group.group_id))
                removed += 1
        return removed

    def discard_bad(self, unit_hash: BlockHash, reason: str) -> int:
        """Forget the unit; its files are deleted on the pool (counted there, in
        ``files_removed``) unless gone or unreadable."""
        self.index.remove(unit_hash)
        if reason not in (MISSING, IO_ERROR, UNSAFE):
            self.submit(functools.partial(self._remove_bad, unit_hash), unit_hash)
        return 0

    def _remove_bad(self, unit_hash: BlockHash) -> None:
        self._hook("delete", self.path(unit_hash, 0))
        self.counters.add("files_removed", self.remove_files(unit_hash))

    def evict(self, entries: list[ResidentUnit]) -> None:
        self.discard(entries)

    def discard(self, entries: list[ResidentUnit]) -> None:
        """Delete evicted units' files on the pool (after any earlier write of the unit)."""
        for entry in entries:
            with self._lock:
                self._deleting[entry.unit_hash] = self._deleting.get(entry.unit_hash, 0) + 1
            self.submit(functools.partial(self._remove_evicted, entry.unit_hash), entry.unit_hash)

    def _remove_evicted(self, unit_hash: BlockHash) -> None:
        try:
            self._hook("delete", self.path(unit_hash, 0))
            self.remove_files(unit_hash)
        finally:
            with self._lock:
                left = self._deleting.pop(unit_hash) - 1
                if left:
                    self._deleting[unit_hash] = left

    def submit(self, fn: Callable[[], Any], key: Hashable | None = None) -> Future[Any]:
        return self.pool.submit(fn, key=key)

    def drain(self, timeout: float = 5.0) -> bool:
        """Wait until the pool has nothing queued or running (tests, tools)."""
        return self.pool.drain(timeout)

    def _quarantine(self, tag: Hashable | None) -> None:
        """The watchdog gave up on an I/O call of unit ``tag``: never use the unit again."""
        self.counters.add("stuck_io.disk")
        if isinstance(tag, bytes):
            unit_hash = BlockHash(tag)
            with self._lock:
                self.quarantined.add(unit_hash)
                self._probing.discard(unit_hash)  # a stuck probe: absent from now on
            self.index.remove(unit_hash)
            self.counters.add("quarantined.disk")

    def take_counters(self) -> dict[str, float]:
        return self.counters.take()

    def shutdown(self) -> None:
        self.pool.shutdown(grace=2.0)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

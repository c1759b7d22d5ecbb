"""The disk tier: one file per unit part, in ``file_format`` (version 2, xxh3-128 checksum).

::

    <disk_path>/<fingerprint>/c<chunk_tokens>/<hash[:2]>/<unit hash hex>.g<group>.kvu

The header carries the fingerprint, the part key, the token span (its end is the unit's end T)
and the payload length; files are written under a temporary name and renamed. At start-up the
index is rebuilt from headers: a unit is present when every group's part is, with the spans and
sizes this layout expects. Files of other fingerprints live in other directories and are never
touched; a file of ours that is truncated or corrupt is removed. One I/O thread writes and
deletes, in order (a unit evicted and stored again is deleted before it is rewritten).

Other processes may share the directory. A lookup that misses the index probes the files of
the unit it missed (``probe``: headers only, nothing written or deleted); a complete unit is
adopted by the scheduler half in ``build_connector_meta`` (``take_found``), where reservations
may evict. A unit found absent is not probed again for ``PROBE_RETRY_SECONDS``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from hybridkv.connectors.config import TierName
from hybridkv.connectors.file_format import (
    CORRUPT,
    IO_ERROR,
    MISSING,
    TRUNCATED,
    PartError,
    read_header,
    read_part,
    write_part,
)
from hybridkv.connectors.offloading.policies import Eviction, create_policy
from hybridkv.connectors.offloading.tier import TierEntry, TierIndex
from hybridkv.connectors.offloading.tier_base import ProbeAnswer, Tier, UnitRef
from hybridkv.connectors.offloading.units import UnitGeometry, part_key
from hybridkv.kv.hashing import BlockHash

SUFFIX = ".kvu"
STALE_SECONDS = 3600.0  # temporary files and incomplete units older than this are debris
PROBE_RETRY_SECONDS = 1.0  # a unit probed and found absent is not probed again sooner
MAX_ABSENT = 4096  # remembered absent units before the expired ones are forgotten


class DiskTier(Tier):
    name = TierName.DISK
    removed_counter = "files_removed"

    def __init__(
        self, root: str, fingerprint: str, capacity: int, eviction: Eviction, geometry: UnitGeometry
    ) -> None:
        self.fingerprint = fingerprint
        self.geometry = geometry
        self.directory = os.path.join(root, fingerprint, f"c{geometry.chunk_tokens}")
        os.makedirs(self.directory, exist_ok=True)
        unit_bytes = geometry.unit_nbytes(geometry.chunk_tokens * 2)
        self.index = TierIndex("disk", capacity, create_policy(eviction, capacity // unit_bytes))
        self.io = ThreadPoolExecutor(1, thread_name_prefix="offload-disk")
        self.num_removed_at_startup = 0
        self.clock: Callable[[], float] = time.monotonic
        # scheduler thread only: probed complete (to adopt) / absent until a clock time
        self._found: dict[BlockHash, tuple[int, BlockHash | None]] = {}
        self._absent: dict[BlockHash, float] = {}
        # evicted units whose deletions are still queued on the I/O thread (never adopted)
        self._deleting: dict[BlockHash, int] = {}
        self._deleting_lock = threading.Lock()
        self.rebuild_index()

    def path(self, unit_hash: BlockHash, group_id: int) -> str:
        name = part_key(unit_hash, group_id) + SUFFIX
        return os.path.join(self.directory, name[:2], name)

    def part_paths(self, unit_hash: BlockHash) -> dict[int, str]:
        """Group id -> file of every part of a unit (an index entry's ``parts``)."""
        return {g.group_id: self.path(unit_hash, g.group_id) for g in self.geometry.layout.groups}

    # -- bytes ---------------------------------------------------------------------------

    def write(self, unit_hash: BlockHash, end: int, parts: dict[int, Any]) -> int:
        """Write every part of a reserved unit (on the I/O thread) and commit it; returns the
        bytes written. On any failure the unit's files are removed and the error propagates."""
        written: list[str] = []
        total = 0
        try:
            for gid, data in parts.items():
                path = self.path(unit_hash, gid)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                array: Any = data.contiguous().numpy()
                payload = memoryview(array)
                span = self.geometry.part_span(gid, end)
                key = part_key(unit_hash, gid)
                total += write_part(path, self.fingerprint, key, span, payload, checksum="xxh3")
                written.append(path)
        except BaseException:
            for path in written:
                _unlink(path)
            raise
        if not self.index.commit(unit_hash, {gid: self.path(unit_hash, gid) for gid in parts}):
            for path in written:  # the reservation was dropped meanwhile
                _unlink(path)
        return total

    def read(self, unit_hash: BlockHash, end: int, group_id: int) -> torch.Tensor:
        """Read and verify one part; ``PartError`` with the reason otherwise."""
        key = part_key(unit_hash, group_id)
        span = self.geometry.part_span(group_id, end)
        nbytes = self.geometry.part_nbytes(group_id, end)
        payload = read_part(self.path(unit_hash, group_id), self.fingerprint, key, span, nbytes)
        return torch.frombuffer(payload, dtype=torch.uint8)  # [nbytes], shares the read buffer

    def remove_files(self, unit_hash: BlockHash) -> int:
        """Delete a unit's files now; returns how many existed."""
        removed = 0
        for group in self.geometry.layout.groups:
            with contextlib.suppress(OSError):
                os.unlink(self.path(unit_hash, group.group_id))
                removed += 1
        return removed

    def discard_bad(self, unit_hash: BlockHash, reason: str) -> int:
        self.index.remove(unit_hash)
        return 0 if reason in (MISSING, IO_ERROR) else self.remove_files(unit_hash)

    def evict(self, entries: list[TierEntry]) -> None:
        self.discard(entries)

    def discard(self, entries: list[TierEntry]) -> None:
        """Delete evicted units' files on the I/O thread (after any earlier write)."""
        for entry in entries:
            with self._deleting_lock:
                self._deleting[entry.unit_hash] = self._deleting.get(entry.unit_hash, 0) + 1
            self.submit(functools.partial(self._remove_evicted, entry.unit_hash))

    def _remove_evicted(self, unit_hash: BlockHash) -> None:
        try:
            self.remove_files(unit_hash)
        finally:
            with self._deleting_lock:
                left = self._deleting.pop(unit_hash) - 1
                if left:
                    self._deleting[unit_hash] = left

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        return self.io.submit(fn)

    # -- units another process wrote (scheduler thread) ----------------------------------

    def probe(self, units: Sequence[UnitRef]) -> ProbeAnswer:
        """``probe_unit`` of ``units[0]`` (files are read one unit at a time)."""
        unit = units[0]
        found = self.probe_unit(unit.unit_hash, unit.end, unit.parent)
        return ProbeAnswer.FOUND if found else ProbeAnswer.ABSENT

    def probe_unit(self, unit_hash: BlockHash, end: int, parent: BlockHash | None) -> bool:
        """Whether a unit the index misses is complete on disk: every group's part present,
        with a header of ours (fingerprint, key) and the span and size this layout expects.
        A unit found waits for ``take_found``; one found absent (or being deleted) is not
        probed again for ``PROBE_RETRY_SECONDS``. Reads headers only, touches no file."""
        if unit_hash in self._found:
            return True
        now = self.clock()
        if self._absent.get(unit_hash, now) > now:
            return False
        if self._is_deleting(unit_hash) or not self._parts_on_disk(unit_hash, end):
            self.mark_absent(unit_hash)
            return False
        self._absent.pop(unit_hash, None)
        self._found[unit_hash] = (end, parent)
        return True

    def take_found(self) -> list[UnitRef]:
        """The units probed complete since the last call, in the order they were found."""
        found, self._found = self._found, {}
        return [UnitRef(unit_hash, end, parent) for unit_hash, (end, parent) in found.items()]

    def adopted_parts(self, unit: UnitRef) -> dict[int, Any]:
        return dict(self.part_paths(unit.unit_hash))

    def mark_absent(self, unit_hash: BlockHash) -> None:
        """Do not probe the unit again for ``PROBE_RETRY_SECONDS``."""
        now = self.clock()
        if len(self._absent) >= MAX_ABSENT:
            self._absent = {h: t for h, t in self._absent.items() if t > now}
        self._absent[unit_hash] = now + PROBE_RETRY_SECONDS

    def _is_deleting(self, unit_hash: BlockHash) -> bool:
        with self._deleting_lock:
            return unit_hash in self._deleting

    def _parts_on_disk(self, unit_hash: BlockHash, end: int) -> bool:
        for group in self.geometry.layout.groups:
            gid = group.group_id
            try:
                if self._part_end(self.path(unit_hash, gid), part_key(unit_hash, gid), gid) != end:
                    return False
            except PartError:
                return False
        return True

    # -- start-up ------------------------------------------------------------------------

    def rebuild_index(self) -> None:
        """Index every complete unit under this directory, least valuable first: longer
        prefixes (tails) before shorter ones, then older before newer."""
        found: dict[BlockHash, dict[int, tuple[int, float]]] = {}  # unit -> gid -> (end, mtime)
        now = time.time()
        for entry in _scan(self.directory):
            parsed = self._check_file(entry, now)
            if parsed is not None:
                unit_hash, gid, end = parsed
                found.setdefault(unit_hash, {})[gid] = (end, entry.stat().st_mtime)
        complete = []
        groups = {g.group_id for g in self.geometry.layout.groups}
        for unit_hash, parts in found.items():
            ends = {end for end, _ in parts.values()}
            mtime = max(m for _, m in parts.values())
            if set(parts) == groups and len(ends) == 1:
                complete.append((-ends.pop(), mtime, unit_hash))
            elif now - mtime > STALE_SECONDS:
                self.num_removed_at_startup += self.remove_files(unit_hash)
        for neg_end, _, unit_hash in sorted(complete):
            self._adopt(unit_hash, -neg_end)

    def _adopt(self, unit_hash: BlockHash, end: int) -> None:
        nbytes = self.geometry.unit_nbytes(end)
        evicted = self.index.reserve(unit_hash, end, nbytes)
        if evicted is None:  # over capacity (disk_bytes shrank): drop it
            self.num_removed_at_startup += self.remove_files(unit_hash)
            return
        for victim in evicted:
            self.num_removed_at_startup += self.remove_files(victim.unit_hash)
        self.index.commit(unit_hash, self.part_paths(unit_hash))

    def _check_file(self, entry: os.DirEntry[str], now: float) -> tuple[BlockHash, int, int] | None:
        """(unit hash, group, end) of a valid part file of ours; removes our broken files."""
        if entry.name.endswith(".tmp"):
            if now - entry.stat().st_mtime > STALE_SECONDS:
                _unlink(entry.path)
            return None
        if not entry.name.endswith(SUFFIX):
            return None
        stem = entry.name[: -len(SUFFIX)]
        hash_hex, _, group = stem.partition(".g")
        try:
            unit_hash, gid = BlockHash(bytes.fromhex(hash_hex)), int(group)
        except ValueError:
            return None  # not a name of ours: never touched
        try:
            end = self._part_end(entry.path, stem, gid)
        except PartError as err:
            if err.reason in (TRUNCATED, CORRUPT):
                _unlink(entry.path)
                self.num_removed_at_startup += 1
            return None
        return None if end is None else (unit_hash, gid, end)

    def _part_end(self, path: str, key: str, group_id: int) -> int | None:
        """The unit end in the header at ``path`` if it is a part of ours (fingerprint, key)
        with the span and payload size this layout expects; else None. ``PartError`` if the
        header cannot be read or is broken."""
        head = read_header(path)
        if head.fingerprint != self.fingerprint or head.key != key:
            return None  # not ours
        end = head.span[1]
        ok = (
            0 <= group_id < len(self.geometry.layout.groups)
            and end > 0
            and end % self.geometry.chunk_tokens == 0
            and head.span == self.geometry.part_span(group_id, end)
            and head.payload_len == self.geometry.part_nbytes(group_id, end)
        )
        return end if ok else None

    def shutdown(self) -> None:
        self.io.shutdown(wait=True)


def _scan(directory: str) -> list[os.DirEntry[str]]:
    out: list[os.DirEntry[str]] = []
    with contextlib.suppress(OSError):
        for sub in os.scandir(directory):
            if sub.is_dir():
                with contextlib.suppress(OSError):
                    out.extend(e for e in os.scandir(sub.path) if e.is_file())
    return out


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

"""The disk tier's start-up: private directories, the recorded budget, the index rebuilt.

The index is rebuilt from authenticated headers (payloads are not read): a unit is adopted when
every group's part is there with the span and size this layout expects. What the scan meets:

- not a regular file (symlink, FIFO, socket, directory in a unit's place): never opened nor
  removed, counted;
- a part our key did not authenticate (forged, another directory's, truncated, oversized,
  renamed): removed (it can never be used: names and headers are keyed);
- a part of an older format version: removed once older than ``STALE_SECONDS`` (a process of
  the older version may still share the directory);
- ``.tmp`` files: removed if their writer (``<host>-<pid>`` in the name) is a dead process of
  this host, or older than ``STALE_SECONDS``;
- incomplete units: removed once older than ``STALE_SECONDS`` (younger ones may be being
  written by another process).

Complete units are adopted most valuable first (short prefixes, then newer) while they fit in
``disk_bytes``; the rest are left on disk untouched, for the process that stored them -- a
process with a smaller budget never mass-deletes a shared directory. The directory records the
``disk_bytes`` it was created with (``budget``); a process with another budget logs it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Protocol

from hybridkv.connectors.offloading.tier import TierIndex
from hybridkv.connectors.offloading.tier_base import TierCounts
from hybridkv.connectors.offloading.tiers.disk.format import (
    MISMATCH,
    PartError,
    tmp_owner_dead,
)
from hybridkv.connectors.offloading.units import UnitGeometry
from hybridkv.kv.hashing import BlockHash

log = logging.getLogger(__name__)

STALE_SECONDS = 3600.0  # temporary files and incomplete units older than this are debris
BUDGET_FILE = "budget"


def make_private_dirs(root: str, directory: str) -> None:
    """Create ``directory`` (under ``root``) 0700; directories this process creates are
    private whatever the umask."""
    path = os.path.abspath(directory)
    todo = []
    while not os.path.isdir(path):
        todo.append(path)
        path = os.path.dirname(path)
    for new in reversed(todo):
        with contextlib.suppress(FileExistsError):
            os.mkdir(new, 0o700)
        os.chmod(new, 0o700)


def parse_key(key: str) -> tuple[BlockHash | None, int]:
    """(unit hash, group id) of a part key ``<hash hex>.g<group>``; (None, -1) if malformed."""
    hash_hex, _, group = key.partition(".g")
    try:
        return BlockHash(bytes.fromhex(hash_hex)), int(group)
    except ValueError:
        return None, -1


class DiskTier(Protocol):
    """What the scan needs of the disk tier it rebuilds (``tier.DiskTier``)."""

    directory: str
    geometry: UnitGeometry
    index: TierIndex
    counters: TierCounts
    num_removed_at_startup: int

    def remove_files(self, unit_hash: BlockHash) -> int: ...

    def part_paths(self, unit_hash: BlockHash) -> dict[int, str]: ...

    def check_part(self, path: str, key: str | None) -> tuple[BlockHash, int, int] | None: ...


@dataclass
class _Scan:
    now: float
    parts: dict[BlockHash, dict[int, tuple[int, float]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n


def rebuild_index(tier: DiskTier) -> None:
    scan = _Scan(time.time())
    for sub in _entries(tier.directory):
        if sub.is_dir(follow_symlinks=False):
            for entry in _entries(sub.path):
                _scan_file(tier, scan, entry)
    complete = []
    groups = {g.group_id for g in tier.geometry.layout.groups}
    for unit_hash, parts in scan.parts.items():
        ends = {end for end, _ in parts.values()}
        mtime = max(m for _, m in parts.values())
        if set(parts) == groups and len(ends) == 1:
            complete.append((ends.pop(), -mtime, unit_hash))
        elif scan.now - mtime > STALE_SECONDS:
            scan.count("removed", tier.remove_files(unit_hash))
    _adopt_within_budget(tier, sorted(complete), scan)
    _check_budget(tier)
    tier.num_removed_at_startup = scan.counts.get("removed", 0)
    for what, n in sorted(scan.counts.items()):
        tier.counters.add(f"startup.disk.{what}", n)
    if any(k != "removed" for k in scan.counts):
        log.info("disk tier %s at start-up: %s", tier.directory, scan.counts)


def _adopt_within_budget(
    tier: DiskTier, units: list[tuple[int, float, BlockHash]], scan: _Scan
) -> None:
    """Adopt the most valuable units that fit; enter them least valuable first."""
    kept, used = [], 0
    for end, _, unit_hash in units:
        nbytes = tier.geometry.unit_nbytes(end)
        if used + nbytes > tier.index.capacity:
            scan.count("left_over_budget")
            continue
        used += nbytes
        kept.append((unit_hash, end, nbytes))
    for unit_hash, end, nbytes in reversed(kept):
        tier.index.reserve(unit_hash, end, nbytes)
        tier.index.commit(unit_hash, tier.part_paths(unit_hash))


def _scan_file(tier: DiskTier, scan: _Scan, entry: os.DirEntry[str]) -> None:
    try:
        if not entry.is_file(follow_symlinks=False):
            scan.count("ignored_not_regular")
            return
        mtime = entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return
    if entry.name.endswith(".tmp"):
        if tmp_owner_dead(entry.name) or scan.now - mtime > STALE_SECONDS:
            _unlink(entry.path)
            scan.count("tmp_removed")
        return
    try:
        found = tier.check_part(entry.path, None)
    except PartError as err:
        if err.reason != MISMATCH or scan.now - mtime > STALE_SECONDS:
            _unlink(entry.path)
            scan.count("removed")
        scan.count(f"refused_{err.reason}")
        return
    if found is None:  # authenticated, but not a part this layout can use
        _unlink(entry.path)
        scan.count("removed")
        return
    unit_hash, gid, end = found
    scan.parts.setdefault(unit_hash, {})[gid] = (end, mtime)


def _check_budget(tier: DiskTier) -> None:
    """Record the budget the directory was created with; say so if ours differs."""
    path = os.path.join(tier.directory, BUDGET_FILE)
    mine = tier.index.capacity
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        recorded = _read_budget(path)
        if recorded is not None and recorded != mine:
            log.warning(
                "disk tier %s was created with disk_bytes=%d; this process uses %d: it indexes "
                "and evicts only its own share (units it stores or adopts), never the rest",
                tier.directory,
                recorded,
                mine,
            )
        return
    except OSError:
        return
    with os.fdopen(fd, "w") as f:
        json.dump({"disk_bytes": mine}, f)


def _read_budget(path: str) -> int | None:
    with contextlib.suppress(OSError, ValueError, TypeError):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd) as f:
            value = json.loads(f.read(4096)).get("disk_bytes")
        return int(value) if isinstance(value, int) else None
    return None


def _entries(directory: str) -> list[os.DirEntry[str]]:
    with contextlib.suppress(OSError), os.scandir(directory) as it:
        return list(it)
    return []


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

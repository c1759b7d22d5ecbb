"""The file tier: where parts live, which are present, and the metadata that names them.

::

    <root>/<fingerprint>/g<group>/<block hash hex>.kv      block k of an attention group
    <root>/<fingerprint>/g<group>/<block hash hex>.state   a state group's state at T = (k+1)*B

A *key* is the path relative to ``<root>/<fingerprint>`` (``"g0/ab12...kv"``). Another model or
layout has another fingerprint, hence another directory: it never sees these files.

The store owns the fact "this key is on disk" (the tier owns residency): an in-memory index
rebuilt from the directory at start-up and updated by completed writes and removals. Both
connector halves of one process share it; the scheduler half only reads it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from dataclasses import dataclass

from hybridkv.kv.hashing import BlockHash

BLOCK_SUFFIX = ".kv"
STATE_SUFFIX = ".state"
_STALE_TMP_SECONDS = 3600.0  # leftovers of a crashed writer; younger ones may be in use


def block_key(group_id: int, block_hash: BlockHash) -> str:
    return f"g{group_id}/{block_hash.hex()}{BLOCK_SUFFIX}"


def state_key(group_id: int, block_hash: BlockHash) -> str:
    return f"g{group_id}/{block_hash.hex()}{STATE_SUFFIX}"


@dataclass(frozen=True, slots=True)
class FileLoadKeys:
    """``LoadSpec.keys`` of the file connector: one key per entry of ``LoadSpec.block_ids`` (same
    nesting) and one per entry of ``LoadSpec.state_slots``."""

    block_keys: tuple[list[str], ...]
    state_keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FileSave:
    """One request's saves of a step (an entry of ``ConnectorMetadata.saves``).

    Block ``block_ids[i]`` is table entry ``block_indices[i]`` (tokens [k*B, (k+1)*B)) and is
    stored under ``block_keys[i]``; state group ``state_groups[j]``'s live slot
    ``state_slots[j]`` holds the state at ``state_end`` and is stored under ``state_keys[j]``."""

    request_id: str
    block_ids: list[int]
    block_indices: list[int]
    block_keys: list[str]
    state_groups: list[int]
    state_slots: list[int]
    state_keys: list[str]
    state_end: int


class FileStore:
    """Paths and the index of present keys under ``<root>/<fingerprint>``. Thread-safe."""

    def __init__(self, root: str, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        self.directory = os.path.join(root, fingerprint)
        os.makedirs(self.directory, exist_ok=True)
        self._lock = threading.Lock()
        self._present: set[str] = set()
        self.rebuild_index()

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key)

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._present

    def __len__(self) -> int:
        with self._lock:
            return len(self._present)

    def prepare_dir(self, key: str) -> None:
        """Create ``key``'s group directory; OSError if it is not a real directory (a symlink
        planted there must not send writes outside the store)."""
        directory = os.path.dirname(self.path(key))
        os.makedirs(directory, exist_ok=True)
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            raise NotADirectoryError(f"{directory} is not a directory (a symlink?)")

    def mark_present(self, key: str) -> None:
        with self._lock:
            self._present.add(key)

    def forget(self, key: str) -> None:
        with self._lock:
            self._present.discard(key)

    def remove(self, key: str) -> bool:
        """Forget ``key`` and delete its file; True if a file was deleted."""
        self.forget(key)
        try:
            os.unlink(self.path(key))
        except OSError:
            return False
        return True

    def rebuild_index(self) -> None:
        """Re-read the directory (start-up); deletes temporary files of long-dead writers."""
        present: set[str] = set()
        now = time.time()
        for group_dir in os.scandir(self.directory):  # symlinks are never followed
            if not (group_dir.is_dir(follow_symlinks=False) and group_dir.name.startswith("g")):
                continue
            for entry in os.scandir(group_dir.path):
                if not entry.is_file(follow_symlinks=False):
                    continue  # a FIFO, device or symlink is never a part
                if entry.name.endswith((BLOCK_SUFFIX, STATE_SUFFIX)):
                    present.add(f"{group_dir.name}/{entry.name}")
                elif entry.name.endswith(".tmp") and _older_than(entry, now, _STALE_TMP_SECONDS):
                    _unlink(entry.path)
        with self._lock:
            self._present = present


def _older_than(entry: os.DirEntry[str], now: float, seconds: float) -> bool:
    try:
        return now - entry.stat().st_mtime > seconds
    except OSError:
        return False


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)

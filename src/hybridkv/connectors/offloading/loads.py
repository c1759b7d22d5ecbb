"""The load path: which payload rows fill which blocks, and moving verified bytes to the device.

A CPU part is copied segment by segment (``tiers.cpu.tier.load_segments``), each segment
checksummed in the same pass as its copy (native kernels) or right after it while its bytes
are still in cache (without them, the load's thread and the copy helpers each take the next
segment left; with them, OpenMP threads share each call's segments).
A disk or remote part (and a CPU state part) is read and verified whole, then written; the
next part's read runs on a read-ahead thread while one is written, so the network or the disk
overlaps the checksum and the copy. A part may reach
the device before the rest of the load is verified, never before it is reported: a bad part's
blocks were fresh to the request and are reported invalid (then recomputed). Every device
write happens inside ``InflightLoad``'s write gate, so none starts after a timeout gave the
load up and the timeout waits for those in progress.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from queue import Empty, SimpleQueue

import torch

from hybridkv.connectors.base import KVCacheAccess
from hybridkv.connectors.offloading.stack import TierStack
from hybridkv.connectors.offloading.tiers.cpu.tier import (
    CpuPart,
    CpuTier,
    load_segments,
    write_rows,
)
from hybridkv.connectors.offloading.units import OffloadLoadKeys, UnitGeometry, UnitSource
from hybridkv.connectors.part_error import CORRUPT, MISSING, PartError
from hybridkv.kv.spec import SpecKind
from hybridkv.step_io import FailureReason, LoadSpec

# Native loads: bytes of segments per kernel call (OpenMP spreads them over threads). A
# timeout waits for at most the call in progress (~5 ms at this size on 2 cores).
BATCH_BYTES = 64 << 20
READ_AHEAD = 2  # whole parts in flight per load: the one being written and the next


@dataclass(slots=True)
class InflightLoad:
    """A load in flight. Device writes happen only between ``try_begin_write`` and
    ``end_write``; ``try_cancel`` (a timeout) lets no write start after it and waits for those
    in progress, so nothing is written once the timeout is reported."""

    spec: LoadSpec
    started: float
    deadline: float  # ``time.monotonic()``: no I/O of the load outlives it (``Tier.read``)
    lock: threading.Lock = field(default_factory=threading.Lock)
    idle: threading.Condition = field(init=False)  # on ``lock``: no write in progress
    num_writers: int = 0
    cancelled: bool = False
    done: bool = False

    def __post_init__(self) -> None:
        self.idle = threading.Condition(self.lock)

    def try_begin_write(self) -> bool:
        with self.lock:
            if self.cancelled:
                return False
            self.num_writers += 1
            return True

    def end_write(self) -> None:
        with self.lock:
            self.num_writers -= 1
            if not self.num_writers:
                self.idle.notify_all()

    def try_cancel(self) -> bool:
        """Give up on the load unless it finished; True if this call gave it up."""
        with self.lock:
            if self.done or self.cancelled:
                return False
            self.cancelled = True
            self.idle.wait_for(lambda: not self.num_writers)
            return True

    def try_finish(self) -> bool:
        """Mark every write done; False if the load was given up on (a timeout reported it)."""
        with self.lock:
            if self.cancelled:
                return False
            self.done = True
            return True


@dataclass(slots=True, eq=False)  # compared and hashed by identity
class LoadPart:
    """One part a load needs: rows of the part payload -> block ids (attention) or a slot."""

    source: UnitSource
    group_id: int
    rows: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    slot: int | None = None


@dataclass(slots=True)
class CpuSegment:
    """The rows of one checksummed segment of a stored CPU part that a load needs."""

    part: LoadPart
    stored: CpuPart
    index: int
    rows: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)


def _batches(segments: list[CpuSegment], max_bytes: int) -> list[list[CpuSegment]]:
    """Consecutive segments in batches of at most ``max_bytes`` (at least one segment each)."""
    batches: list[list[CpuSegment]] = []
    size = 0
    for segment in segments:
        nbytes = segment.stored.segment(segment.index).nbytes
        if not batches or size + nbytes > max_bytes:
            batches.append([])
            size = 0
        batches[-1].append(segment)
        size += nbytes
    return batches


def plan_parts(geometry: UnitGeometry, spec: LoadSpec) -> list[LoadPart]:
    """The parts ``spec`` reads and which payload row fills which block."""
    keys = spec.keys
    if not isinstance(keys, OffloadLoadKeys):
        raise TypeError(f"load of {spec.request_id} carries no offload keys")
    layout = geometry.layout
    by_end = {s.end: s for s in keys.units}
    last = keys.units[-1]
    parts: dict[tuple[int, int], LoadPart] = {}
    for gid, ids, indices in zip(
        layout.attention_group_ids, spec.block_ids, spec.block_indices, strict=True
    ):
        sliding = layout.groups[gid].kind is SpecKind.SLIDING
        part, first = None, 0
        for block_id, k in zip(ids, indices, strict=True):
            end = last.end if sliding else geometry.unit_end_of_block(k)
            if part is None or part.source.end != end:  # the next unit's part
                part = parts.get((end, gid)) or parts.setdefault(
                    (end, gid), LoadPart(by_end[end], gid)
                )
                first = geometry.first_block(gid, end)
            part.rows.append(k - first)
            part.block_ids.append(block_id)
    out = list(parts.values())
    for gid, slot in zip(layout.state_group_ids, spec.state_slots, strict=True):
        out.append(LoadPart(last, gid, slot=slot))
    return out


class PartWriter:
    """Writes a load's parts from the tiers into the device cache, verifying every byte."""

    cache: KVCacheAccess  # set when the worker's caches are registered

    def __init__(self, geometry: UnitGeometry, stack: TierStack, num_copy_helpers: int) -> None:
        self.layout = geometry.layout
        self.stack = stack
        self._num_helpers = num_copy_helpers
        self._helpers = ThreadPoolExecutor(max(1, num_copy_helpers), "offload-copy")
        self._readers = ThreadPoolExecutor(2, "offload-read-ahead")

    def write(
        self, load: InflightLoad, parts: list[LoadPart]
    ) -> list[tuple[LoadPart, FailureReason]]:
        """Write every good part (stopping early once ``load`` is given up); the bad parts,
        in plan order, with their ``PartError`` reasons. Returns after every write ended."""
        failed: dict[LoadPart, FailureReason] = {}
        segments, whole = self._split(parts, failed)
        failed.update(dict.fromkeys(self._copy_segments(load, segments), CORRUPT))
        self._write_whole(load, whole, failed)
        return [(p, failed[p]) for p in parts if p in failed]

    def shutdown(self) -> None:
        self._helpers.shutdown(wait=True)
        self._readers.shutdown(wait=True)

    def _write_whole(
        self, load: InflightLoad, parts: list[LoadPart], failed: dict[LoadPart, FailureReason]
    ) -> None:
        """Read, verify and write whole parts in order, ``READ_AHEAD`` reads in flight."""
        todo = iter(parts)
        ahead: deque[tuple[LoadPart, Future[torch.Tensor]]] = deque()
        try:
            while True:
                while len(ahead) < READ_AHEAD and (part := next(todo, None)) is not None:
                    ahead.append((part, self._readers.submit(self._read, part, load.deadline)))
                if not ahead or load.cancelled:  # timed out: the result is reported already
                    return
                part, read = ahead.popleft()
                try:
                    payload = read.result()
                except PartError as err:
                    failed[part] = err.reason
                    continue
                if not self._write_part(load, part, payload):
                    return
        finally:
            for _, read in ahead:  # reads only fill memory: unwanted ones are dropped
                read.cancel()

    def _split(
        self, parts: list[LoadPart], failed: dict[LoadPart, FailureReason]
    ) -> tuple[list[CpuSegment], list[LoadPart]]:
        """Attention parts of memory tiers as the segments the load needs; the other parts,
        read whole."""
        segments: list[CpuSegment] = []
        whole: list[LoadPart] = []
        for part in parts:
            source = part.source
            tier = self.stack.get(source.tier)
            if not isinstance(tier, CpuTier) or part.slot is not None:
                whole.append(part)
                continue
            try:
                stored = tier.get(source.unit_hash, part.group_id)
            except PartError as err:
                failed[part] = err.reason
                continue
            by_index: dict[int, CpuSegment] = {}
            segment = None
            for row, block_id in zip(part.rows, part.block_ids, strict=True):
                index = row // stored.rows_per_segment
                if segment is None or segment.index != index:
                    segment = by_index.get(index) or by_index.setdefault(
                        index, CpuSegment(part, stored, index)
                    )
                segment.rows.append(row)
                segment.block_ids.append(block_id)
            segments.extend(by_index.values())
        return segments, whole

    def _copy_segments(self, load: InflightLoad, segments: list[CpuSegment]) -> set[LoadPart]:
        """Copy and verify ``segments``; the parts with a bad segment. Native kernels take
        up to ``BATCH_BYTES`` per call on OpenMP threads; otherwise this thread and the copy
        helpers each take the next segment left. Returns after every copy ended."""
        native = self.cache.page_table() is not None and all(
            s.stored.kernel is not None for s in segments
        )
        todo: SimpleQueue[list[CpuSegment]] = SimpleQueue()
        for batch in _batches(segments, BATCH_BYTES if native else 0):
            todo.put(batch)

        def drain() -> set[LoadPart]:
            bad: set[LoadPart] = set()
            while True:
                try:
                    batch = todo.get_nowait()
                except Empty:
                    return bad
                verified = self._write_batch(load, batch)
                if verified is None:  # given up on
                    return bad
                bad.update(s.part for s, ok in zip(batch, verified, strict=True) if not ok)

        num_helpers = 0 if native else min(self._num_helpers, len(segments) - 1)
        helpers = [self._helpers.submit(drain) for _ in range(num_helpers)]
        try:
            bad = drain()
        finally:  # NOTE: a helper still copying must end before this load reports anything
            wait([h for h in helpers if not h.cancel()])
        for helper in helpers:
            if not helper.cancelled():
                bad |= helper.result()
        return bad

    def _write_batch(self, load: InflightLoad, batch: list[CpuSegment]) -> list[bool] | None:
        """Write the segments' rows and verify each whole segment: whether each matched, or
        None (nothing written) if the load was given up on."""
        if not load.try_begin_write():
            return None
        try:
            items = [(s.stored, s.index, s.rows, s.block_ids) for s in batch]
            return load_segments(self.cache, items)
        finally:
            load.end_write()

    def _read(self, part: LoadPart, deadline: float) -> torch.Tensor:
        """The part's payload, read whole and verified; ``PartError`` if it is bad or gone."""
        source = part.source
        tier = self.stack.get(source.tier)
        if tier is None:
            raise PartError(MISSING, f"unit {source.unit_hash.hex()} in no tier")
        return tier.read(source.unit_hash, source.end, part.group_id, deadline)

    def _write_part(self, load: InflightLoad, part: LoadPart, payload: torch.Tensor) -> bool:
        """Write a verified whole part; False (nothing written) if the load was given up."""
        if not load.try_begin_write():
            return False
        try:
            if part.slot is not None:
                self.cache.write_state(part.group_id, part.slot, payload.view(-1))
            else:
                self._write_rows(payload, part.rows, part.block_ids)
        finally:
            load.end_write()
        return True

    def _write_rows(self, payload: torch.Tensor, rows: list[int], block_ids: list[int]) -> None:
        """Rows ``rows`` of a flat part payload into ``block_ids``."""
        data = payload.view(-1, self.layout.group_size, self.layout.layer_page_bytes)
        write_rows(self.cache, data, rows, block_ids)

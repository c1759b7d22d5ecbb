"""Host memory for CPU-tier parts: buffers of evicted parts are reused for new ones.

A snapshot into never-used memory is bound by page faults (each page is faulted and zeroed on
first write, and in a VM the host may fault it in too: 1-1.7 GB/s here, against ~10 GB/s for a
copy into memory already mapped, docs/benchmarks.md B4). So the tier keeps the buffers of the
parts it evicts, by exact size, and a new part of that size takes one; a tier that stores and
evicts at a steady rate then copies into mapped memory. (``MADV_HUGEPAGE`` buffers were tried:
faster at first, then slower than plain pages once the kernel had to compact for them.) Free
buffers plus stored parts never exceed the tier's capacity (``trim``).
"""

from __future__ import annotations

import logging
import threading

import torch

log = logging.getLogger(__name__)
PROGRESS_BYTES = 1 << 30  # preallocation logs its progress every GiB


class HostBuffers:
    """Free buffers by size, shared by the tier's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[int, list[torch.Tensor]] = {}
        self.num_free_bytes = 0

    def take(self, nbytes: int) -> torch.Tensor:
        """A ``[nbytes]`` uint8 buffer: a freed one if any, else a fresh one. Its bytes are
        whatever they were: the caller overwrites all of them."""
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self.num_free_bytes -= nbytes
                return free.pop()
        return torch.empty(nbytes, dtype=torch.uint8)

    def preallocate(self, sizes: list[int], room: int) -> int:
        """Map and touch free buffers of ``sizes`` (one set after another, each set the parts
        of one unit) while they fit in ``room``; returns the bytes mapped. Logs progress."""
        total, step = 0, sum(sizes)
        next_report = PROGRESS_BYTES
        while step and total + step <= room:
            for nbytes in sizes:
                self.give(torch.empty(nbytes, dtype=torch.uint8).zero_(), room)
            total += step
            if total >= next_report:
                log.info("CPU tier: %d of %d MiB mapped", total >> 20, room >> 20)
                next_report += PROGRESS_BYTES
        return total

    def give(self, buffer: torch.Tensor, room: int) -> None:
        """Keep ``buffer`` (no one else may use it any more) if the free buffers stay within
        ``room`` bytes; otherwise let it go."""
        nbytes = buffer.numel()
        with self._lock:
            if self.num_free_bytes + nbytes <= room:
                self._free.setdefault(nbytes, []).append(buffer.view(-1))
                self.num_free_bytes += nbytes

    def trim(self, room: int) -> None:
        """Let free buffers go until they hold at most ``room`` bytes."""
        with self._lock:
            for nbytes in sorted(self._free, reverse=True):
                free = self._free[nbytes]
                while free and self.num_free_bytes > room:
                    free.pop()
                    self.num_free_bytes -= nbytes
            self._free = {n: f for n, f in self._free.items() if f}

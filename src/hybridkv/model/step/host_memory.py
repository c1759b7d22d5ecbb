"""Host tensors on transparent huge pages, where the kernel offers them.

The KV cache's backing tensors are advised ``MADV_HUGEPAGE`` before their first touch. On a
kernel whose THP mode is ``madvise`` (the common default) they then fault in 2 MiB pages:
fewer TLB misses for attention, and a same-host NIXL read (UCX ``cma``, i.e.
``process_vm_readv``, which pins the remote pages one page at a time) runs ~1.2-1.3x faster at
1-4 MiB (docs/benchmarks.md, "B6 floor"). The advice changes no byte; where THP is off or the
call fails the tensor keeps 4 KiB pages. ``HYBRIDKV_HUGEPAGES=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys

import torch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # linux/mman.h


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or os.environ.get("HYBRIDKV_HUGEPAGES") == "0":
        return None
    return ctypes.CDLL(None, use_errno=True)


_LIBC = _libc()


def huge_range(address: int, nbytes: int, page: int = HUGE_PAGE) -> tuple[int, int]:
    """The ``page``-aligned part ``[start, end)`` of ``[address, address + nbytes)``; empty
    (``start == end``) when no whole page fits."""
    start = -(-address // page) * page
    return start, max(start, (address + nbytes) // page * page)


def advise_huge(tensor: torch.Tensor) -> bool:
    """Ask for huge pages under ``tensor``'s aligned interior; True if the kernel took the
    advice. Only pages not yet touched are affected."""
    if _LIBC is None or tensor.device.type != "cpu":
        return False
    start, end = huge_range(tensor.data_ptr(), tensor.numel() * tensor.element_size())
    if end == start:
        return False
    result: int = _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE)  # fmt: skip
    return result == 0


def _aligned_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty(shape)`` starting on a huge-page boundary, so every whole 2 MiB of it can
    be a huge page (an unaligned start leaves up to 4 MiB at its ends on 4 KiB pages). The
    slack before and after is reserved, never touched: it costs address space, not memory."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)
    skip = -raw.data_ptr() % HUGE_PAGE
    return raw[skip : skip + nbytes].view(dtype).view(shape)


def zeros_huge(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``torch.zeros(shape)``, on huge pages where possible (host memory only); tensors of at
    least a huge page start on a huge-page boundary."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    big = _LIBC is not None and math.prod(shape) * dtype.itemsize >= HUGE_PAGE
    tensor = _aligned_empty(shape, dtype) if big else torch.empty(shape, dtype=dtype)
    advise_huge(tensor)
    return tensor.zero_()

"""Huge-page advice for the KV cache's host tensors (``model/host_memory``)."""

from __future__ import annotations

import sys

import pytest
import torch

from hybridkv.model.step import host_memory
from hybridkv.model.step.host_memory import HUGE_PAGE, huge_range, zeros_huge


def test_huge_range_is_the_aligned_interior() -> None:
    assert huge_range(0, 3 * HUGE_PAGE) == (0, 3 * HUGE_PAGE)
    assert huge_range(1, 3 * HUGE_PAGE) == (HUGE_PAGE, 3 * HUGE_PAGE)
    assert huge_range(HUGE_PAGE - 64, 2 * HUGE_PAGE + 64) == (HUGE_PAGE, 3 * HUGE_PAGE)
    start, end = huge_range(4096, HUGE_PAGE)  # no whole huge page inside
    assert start == end == HUGE_PAGE


def test_zeros_huge_is_zeros() -> None:
    t = zeros_huge((5, 3 << 20), torch.uint8)
    assert t.shape == (5, 3 << 20) and t.dtype == torch.uint8 and t.is_contiguous()
    assert int(t.count_nonzero()) == 0
    small = zeros_huge((4, 16), torch.float32)
    assert torch.equal(small, torch.zeros(4, 16))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_big_tensors_start_on_a_huge_page() -> None:
    """An unaligned start would leave the first and last partial 2 MiB on 4 KiB pages."""
    t = zeros_huge((3, HUGE_PAGE // 4 + 5), torch.float32)
    assert t.data_ptr() % HUGE_PAGE == 0
    assert t.shape == (3, HUGE_PAGE // 4 + 5) and t.is_contiguous()
    t[-1, -1] = 7.0  # the whole extent is writable and zeroed
    assert float(t.sum()) == 7.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_advice_is_taken_on_linux() -> None:
    t = torch.empty(4 * HUGE_PAGE, dtype=torch.uint8)
    assert host_memory.advise_huge(t)
    assert not host_memory.advise_huge(torch.empty(64, dtype=torch.uint8))  # nothing aligned


def test_opt_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYBRIDKV_HUGEPAGES", "0")
    assert host_memory._libc() is None
    monkeypatch.setattr(host_memory, "_LIBC", None)
    assert not host_memory.advise_huge(torch.empty(4 * HUGE_PAGE, dtype=torch.uint8))
    assert int(zeros_huge((2, HUGE_PAGE), torch.uint8).count_nonzero()) == 0

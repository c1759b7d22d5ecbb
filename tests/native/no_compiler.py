"""The check every native kernel library shares: without a compiler (``CC`` names no program)
its loader returns None, logs why and leaves no half-built library; with ``HYBRIDKV_NATIVE=0``
it returns None too."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

K = TypeVar("K")


def built_or_skip(kernels: K | None) -> K:
    """A loaded kernel library, or the test is skipped (no compiler, ``HYBRIDKV_NATIVE=0``)."""
    if kernels is None:
        pytest.skip("native kernels unavailable (no compiler or HYBRIDKV_NATIVE=0)")
    return kernels


def assert_unavailable_without_compiler(
    load: Callable[[], object],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``load`` is the loader's uncached body (``load_x.__wrapped__``)."""
    monkeypatch.delenv("HYBRIDKV_NATIVE", raising=False)  # the compiler's absence, not the switch
    monkeypatch.setenv("HYBRIDKV_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.WARNING, logger="hybridkv.native"):
        assert load() is None
    assert message in caplog.text
    assert not list(tmp_path.rglob("*.so*"))  # no half-written library left behind
    monkeypatch.delenv("CC")
    monkeypatch.setenv("HYBRIDKV_NATIVE", "0")
    assert load() is None

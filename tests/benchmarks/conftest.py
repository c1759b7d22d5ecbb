"""The benchmarks' quick runs share one checkpoint directory per test run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def bench_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``--cache-dir`` for the quick runs: the scripts build their checkpoints there once
    (``ensure_model`` builds beside and renames, so racing builders are safe) for the whole run,
    pytest-xdist's workers included (their base directories share a parent), instead of once per
    test."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "bench-checkpoints"
    path.mkdir(exist_ok=True)
    return path

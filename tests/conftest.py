"""Fixtures shared by every test package, and the test tiers.

Tiers (markers, set here from where a test lives and what it uses, so no test file repeats
them): ``e2e`` (``tests/e2e_*`` and ``tests/cli``: real engines and processes end to end),
``bench``
(``tests/benchmarks``: benchmark scripts run quickly), ``model`` (builds or runs a model: every
test in ``tests/model`` and ``tests/engine``, and any test taking a checkpoint fixture), and
``slow`` (marked by hand: more than a few seconds). ``make test-fast`` runs the rest (the KV
and scheduler control plane, connector units, the fake-engine server, the kernels)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridkv.native import PageCopy, load_pagecopy
from tests.support import lifetimes

TESTS = Path(__file__).resolve().parent
TIER_OF_FOLDER = {"benchmarks": "bench", "model": "model", "engine": "model", "cli": "e2e"}
CHECKPOINT_FIXTURES = frozenset(
    {"checkpoints", "checkpoint", "hf_checkpoints", "model_dir", "tiny", "model", "served",
     "wide_checkpoints"}
)  # fmt: skip


def tier_of(item: pytest.Item) -> str | None:
    """The tier marker ``item`` gets (None: the fast tier)."""
    folder = item.path.relative_to(TESTS).parts[0]
    if folder.startswith("e2e_"):
        return "e2e"
    if folder in TIER_OF_FOLDER:
        return TIER_OF_FOLDER[folder]
    if CHECKPOINT_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "model"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if tier is not None:
            item.add_marker(tier)


@pytest.fixture(scope="session")
def native() -> PageCopy:
    """The native page-copy kernels. Skipped only where they cannot exist (no C compiler, or
    ``HYBRIDKV_NATIVE=0``); with a compiler present, a failed build fails the test."""
    kernel = load_pagecopy()
    if kernel is not None:
        return kernel
    if os.environ.get("HYBRIDKV_NATIVE") == "0":
        pytest.skip("HYBRIDKV_NATIVE=0")
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler: the native kernels cannot be built here")
    pytest.fail("a C compiler is present but the native kernels did not build (see the log)")


@pytest.fixture(autouse=True, scope="session")
def _close_session_engines() -> Iterator[None]:
    """What a builder cached for the session (``lifetimes.keep``) is closed at its end."""
    yield
    lifetimes.close_session()


@pytest.fixture(autouse=True, scope="module")
def _close_module_engines() -> Iterator[None]:
    """Engines a module's fixtures built (``lifetimes.track``) are closed when it ends."""
    start = lifetimes.mark()
    yield
    lifetimes.close_since(start)


@pytest.fixture(autouse=True)
def _close_test_engines() -> Iterator[None]:
    """Engines and connector doubles a test built are closed when it ends, failed or not."""
    start = lifetimes.mark()
    yield
    lifetimes.close_since(start)

"""Fixtures shared by every test package, and the test tiers.

Tiers (markers, set here from where a test lives and what it uses, so no test file repeats
them): ``e2e`` (``tests/e2e_*`` and ``tests/cli``: real engines and processes end to end),
``bench``
(``tests/benchmarks``: benchmark scripts run quickly), ``model`` (builds or runs a model: every
test in ``tests/model`` and ``tests/engine``, and any test taking a checkpoint fixture), and
``slow`` (marked by hand: more than a few seconds). ``make test-fast`` runs the rest (the KV
and scheduler control plane, connector units, the fake-engine server, the kernels)."""

from __future__ import annotations

import itertools
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

# Before torch loads OpenMP: its idle threads sleep instead of spinning. Two pytest workers and
# the engines they start share two cores, so a spinning thread takes the core another process
# needs: a tiny-model decode used 2.5x the CPU time and twice the wall time under load.
# Subprocesses inherit it. (The engine itself keeps OpenMP's defaults.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

from tests.support import lifetimes, scheduling  # noqa: E402

if TYPE_CHECKING:
    # Imported where used: they load torch, and the pytest-xdist controller, which loads this
    # file but runs no test, would spend ~5 s of CPU on them before it starts the workers.
    from hybridkv.native import PageCopy
    from tests.support.checkpoints import SharedCheckpoints
    from tests.support.families import FamilyCheckpoints

TESTS = Path(__file__).resolve().parent
TIER_OF_FOLDER = {"benchmarks": "bench", "model": "model", "engine": "model", "cli": "e2e"}
CHECKPOINT_FIXTURES = frozenset(
    {"checkpoints", "checkpoint", "hf_checkpoints", "model_dir", "tiny", "model", "served",
     "wide_checkpoints", "shared_checkpoints", "family_checkpoints"}
)  # fmt: skip


def folder_tier(path: Path) -> str | None:
    """The tier of every test under ``path`` by its folder (None: decided test by test)."""
    parts = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
    if not parts:
        return None
    return "e2e" if parts[0].startswith("e2e_") else TIER_OF_FOLDER.get(parts[0])


def tier_of(item: pytest.Item) -> str | None:
    """The tier marker ``item`` gets (None: the fast tier)."""
    tier = folder_tier(item.path)
    if tier is None and CHECKPOINT_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "model"
    return tier


def can_select(markexpr: str, tier: str) -> bool:
    """Whether ``-m markexpr`` can select some test marked ``tier`` (whatever other markers
    it carries); True whenever unsure."""
    names = set(re.split(r"[\s()]+", markexpr)) - {"", "and", "or", "not", tier}
    if "(" in markexpr.replace("not (", "") or len(names) > 8:
        return True  # marker arguments, or too many names to try every combination
    try:
        from _pytest.mark.expression import Expression  # pytest's own parser (not public)

        expr = Expression.compile(markexpr)
    except Exception:
        return True
    for on in itertools.product((False, True), repeat=len(names)):
        marked = {tier} | {n for n, set_ in zip(sorted(names), on, strict=True) if set_}
        if expr.evaluate(marked.__contains__):
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A folder whose tier ``-m`` deselects (``make test-fast``) is not even imported: its
    modules pull in transformers and the engine for tests that would not run."""
    tier = folder_tier(collection_path)
    markexpr = config.option.markexpr
    if tier is None or not markexpr or can_select(markexpr, tier):
        return None
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if tier is not None:
            item.add_marker(tier)
    scheduling.order_worker_items(config, items)  # a pytest-xdist worker's units, longest first


def pytest_configure(config: pytest.Config) -> None:
    """With pytest-xdist on: its controller's hooks (tests/support/scheduling.py)."""
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(scheduling.XdistHooks(), "hybridkv-scheduling")


@pytest.fixture(scope="session")
def native() -> PageCopy:
    """The native page-copy kernels. Skipped only where they cannot exist (no C compiler, or
    ``HYBRIDKV_NATIVE=0``); with a compiler present, a failed build fails the test."""
    from hybridkv.native import load_pagecopy

    kernel = load_pagecopy()
    if kernel is not None:
        return kernel
    if os.environ.get("HYBRIDKV_NATIVE") == "0":
        pytest.skip("HYBRIDKV_NATIVE=0")
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler: the native kernels cannot be built here")
    pytest.fail("a C compiler is present but the native kernels did not build (see the log)")


@pytest.fixture(scope="session")
def shared_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> SharedCheckpoints:
    """Tiny transformers-built checkpoints, each built once per session for every folder."""
    from tests.support.checkpoints import SharedCheckpoints

    return SharedCheckpoints(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> FamilyCheckpoints:
    """Every registered family's tiny checkpoint, built on first use, once per session (so
    the transformers references memoised per checkpoint are shared by every folder too)."""
    from tests.support.families import FamilyCheckpoints

    return FamilyCheckpoints(tmp_path_factory.mktemp("families"))


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

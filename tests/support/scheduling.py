"""How ``pytest -n 2`` (``make test``) hands tests to its workers (issue 27).

xdist's ``--dist load`` deals tests out in chunks, so a module whose tests share a module-scoped
server, fleet or engine was often split across both workers, and each built its own. Here:

- a *unit* is what one worker runs: a whole module if any of its tests uses a module-, class-
  or package-scoped fixture (so it is built once), else a single test;
- units run longest first (times from ``tests/support/durations.json``, a guess by tier for
  tests it lacks), so no long test starts last while the other worker idles.

The controller sees only node ids, so the workers tell it: each writes the modules it keeps
whole to a directory the controller named in ``workerinput``, and puts its collection in unit
order (every worker the same), before the controller schedules.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

from tests.support.durations import estimate_seconds, load_durations

SHARED_SCOPES = frozenset({"module", "class", "package"})
# the root conftest's module-scoped autouse fixture only closes what a module built
IGNORED_FIXTURES = frozenset({"_close_module_engines"})
INPUT_KEY = "hybridkv_units_dir"
UNITS_DIR = pytest.StashKey[Path]()


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str, whole: frozenset[str]) -> str:
    """The unit ``nodeid`` runs in: its module if that is kept whole, else itself."""
    module = module_of(nodeid)
    return module if module in whole else nodeid


def shares_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture that outlives one test but not the session."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs and defs[-1].scope in SHARED_SCOPES
        for name, defs in info.name2fixturedefs.items()
        if name not in IGNORED_FIXTURES
    )


def whole_modules(items: Iterable[pytest.Item]) -> frozenset[str]:
    return frozenset(module_of(item.nodeid) for item in items if shares_fixture(item))


def in_unit_order(
    items: Sequence[pytest.Item], whole: frozenset[str], seconds: dict[str, float]
) -> list[pytest.Item]:
    """``items`` grouped by unit, the units longest first (ties: collection order), each unit's
    tests in collection order."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item.nodeid, whole), []).append(item)
    cost = {unit: sum(estimate_seconds(i, seconds) for i in its) for unit, its in units.items()}
    ordered = sorted(units, key=lambda unit: -cost[unit])
    return [item for unit in ordered for item in units[unit]]


def name_units_dir(node: WorkerController) -> None:
    """Controller side (``pytest_configure_node``): where ``node`` reports its whole modules."""
    config = node.config
    if config.getvalue("dist") != "load":
        return
    if UNITS_DIR not in config.stash:
        config.stash[UNITS_DIR] = Path(tempfile.mkdtemp(prefix="hybridkv-units-"))
    node.workerinput[INPUT_KEY] = str(config.stash[UNITS_DIR])


def order_worker_items(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Worker side (after collection): report the whole modules, put ``items`` in unit order."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if workerinput is None or INPUT_KEY not in workerinput:
        return
    whole = whole_modules(items)
    out = Path(workerinput[INPUT_KEY]) / f"{workerinput['workerid']}.json"
    part = out.with_suffix(".part")
    part.write_text(json.dumps(sorted(whole)))
    part.replace(out)
    items[:] = in_unit_order(items, whole, load_durations())


class WholeModuleScheduling(LoadScopeScheduling):
    """xdist's scope scheduling over the units above, in the workers' (longest first) order."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self.whole: frozenset[str] = frozenset()
        # the workers ordered their collections; xdist's reorder (by test count) would undo it
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid, self.whole)

    def schedule(self) -> None:
        if self.collection is None:  # the first call: every worker has reported
            self.whole = read_whole_modules(self.config.stash[UNITS_DIR])
        super().schedule()


def read_whole_modules(directory: Path) -> frozenset[str]:
    """The union of the workers' reports (they collect the same tests); removes them."""
    whole: set[str] = set()
    for report in directory.glob("*.json"):
        whole.update(json.loads(report.read_text()))
    shutil.rmtree(directory, ignore_errors=True)
    return frozenset(whole)


def make_scheduler(config: pytest.Config, log: Any) -> WholeModuleScheduling | None:
    """``pytest_xdist_make_scheduler``: ours for ``--dist load`` (``-n`` alone), else xdist's."""
    if config.getvalue("dist") != "load" or UNITS_DIR not in config.stash:
        return None
    return WholeModuleScheduling(config, log)


class XdistHooks:
    """pytest-xdist's controller hooks, registered by ``tests/conftest.py`` when xdist is on."""

    def pytest_configure_node(self, node: WorkerController) -> None:
        name_units_dir(node)

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(
        self, config: pytest.Config, log: Any
    ) -> WholeModuleScheduling | None:
        return make_scheduler(config, log)

"""How ``pytest -n`` hands out the suite (``tests/support/scheduling.py``): a module sharing a
module- or class-scoped fixture runs whole on one worker, the rest test by test, the longest
units first."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import scheduling
from tests.support.durations import ROOT, estimate_seconds, nodeid_of, read_junit

pytest_plugins = ["pytester"]

MODULES = {
    "test_shared.py": """
import os, pytest

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    (tmp_path_factory.getbasetemp().parent / f"built-{os.getpid()}").write_text("")
    return 1

@pytest.mark.parametrize("i", range(6))
def test_uses_it(server, i):
    assert server == 1
""",
    "test_plain.py": """
import pytest

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    pass

@pytest.mark.slow
def test_marked_slow():
    pass
""",
    "test_by_class.py": """
import pytest

class TestOne:
    @pytest.fixture(scope="class")
    def thing(self):
        return 2

    def test_a(self, thing):
        assert thing == 2

    def test_b(self, thing):
        assert thing == 2
""",
}
CONFTEST = """
from tests.support import scheduling

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: slow")
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(scheduling.XdistHooks(), "hybridkv-scheduling")

def pytest_collection_modifyitems(config, items):
    scheduling.order_worker_items(config, items)
"""


def make_suite(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    for name, text in MODULES.items():
        pytester.makepyfile(**{name.removesuffix(".py"): text})


def test_modules_sharing_a_fixture_are_kept_whole(pytester: pytest.Pytester) -> None:
    make_suite(pytester)
    items, _ = pytester.inline_genitems()
    whole = scheduling.whole_modules(items)
    assert whole == {"test_shared.py", "test_by_class.py"}
    assert scheduling.unit_of("test_shared.py::test_uses_it[3]", whole) == "test_shared.py"
    assert (
        scheduling.unit_of("test_plain.py::test_alone[3]", whole) == "test_plain.py::test_alone[3]"
    )


def test_units_run_longest_first_each_in_collection_order(pytester: pytest.Pytester) -> None:
    make_suite(pytester)
    items, _ = pytester.inline_genitems()
    whole = scheduling.whole_modules(items)
    seconds = {"test_by_class.py::TestOne::test_b": 9.0, "test_plain.py::test_alone[4]": 30.0}
    ordered = [i.nodeid for i in scheduling.in_unit_order(items, whole, seconds)]
    assert sorted(ordered) == sorted(i.nodeid for i in items)  # nothing lost or repeated
    assert ordered[:4] == [
        "test_plain.py::test_alone[4]",  # 30 s
        "test_by_class.py::TestOne::test_a",  # the class's module: 9 s + a guess
        "test_by_class.py::TestOne::test_b",
        "test_plain.py::test_marked_slow",  # a guess for the slow tier: 4 s
    ]
    shared = [n for n in ordered if n.startswith("test_shared.py")]
    assert shared == [f"test_shared.py::test_uses_it[{i}]" for i in range(6)]
    assert ordered.index(shared[0]) + 6 == ordered.index(shared[-1]) + 1  # contiguous


def test_an_unmeasured_test_is_guessed_by_its_tier(pytester: pytest.Pytester) -> None:
    make_suite(pytester)
    items, _ = pytester.inline_genitems()
    by_id = {i.nodeid: i for i in items}
    assert estimate_seconds(by_id["test_plain.py::test_marked_slow"], {}) == 4.0
    assert estimate_seconds(by_id["test_plain.py::test_alone[0]"], {}) < 0.1
    assert estimate_seconds(by_id["test_plain.py::test_alone[0]"], {"test_plain.py::test_alone[0]": 7.0}) == 7.0  # fmt: skip


@pytest.mark.slow
def test_two_workers_build_a_module_fixture_once(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_suite(pytester)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=15)
    base = Path(str(pytester.path))  # the run's basetemp is under it, or under its parent
    built = list(base.parent.rglob("built-*")) + list(base.rglob("built-*"))
    assert len({p.name for p in built}) == 1, built  # one worker built the server
    workers = {
        line.split("]")[0]
        for line in result.outlines
        if "test_shared.py::" in line and "[gw" in line
    }
    assert len(workers) == 1, result.outlines


def test_junit_cases_map_to_node_ids(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_scheduling" name="test_x[a]" time="2.5"/>'
        '<testcase classname="tests.test_scheduling.TestC" name="test_y" time="1.0"/>'
        '<testcase classname="tests.test_scheduling" name="test_fast" time="0.2"/>'
        '<testcase classname="tests.gone" name="test_z" time="9"/>'
        "</testsuite></testsuites>"
    )
    assert read_junit(report) == {
        "tests/test_scheduling.py::test_x[a]": 2.5,
        "tests/test_scheduling.py::TestC::test_y": 1.0,
    }
    assert nodeid_of("tests.gone", "test_z") is None


def test_the_durations_table_names_tests_by_node_id() -> None:
    table = json.loads(Path(scheduling.__file__).with_name("durations.json").read_text())
    assert table and all(k.startswith("tests/") and ".py::" in k for k in table)
    assert all(isinstance(v, float | int) and v >= 1.0 for v in table.values())

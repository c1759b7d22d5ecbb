"""Measured test times, for ordering the suite's units longest first (``scheduling.py``).

``durations.json`` holds every test that took at least ``MIN_SECONDS`` (setup + call +
teardown) in a whole-suite run, by node id. It only orders work: a stale or missing entry
makes the run slower, never wrong. Refresh it from a run's JUnit report:

    .venv/bin/python -m pytest -n 2 --junitxml=/tmp/junit.xml
    .venv/bin/python -m tests.support.durations /tmp/junit.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLE = Path(__file__).with_name("durations.json")
MIN_SECONDS = 1.0
# a test the table lacks, by tier (tests/conftest.py); the fast tier's tests take milliseconds
GUESS_BY_TIER = {"bench": 20.0, "e2e": 4.0, "slow": 4.0, "model": 0.5}
GUESS_FAST = 0.02


@cache
def load_durations() -> dict[str, float]:
    if not TABLE.exists():
        return {}
    table: dict[str, float] = json.loads(TABLE.read_text())
    return table


def estimate_seconds(item: pytest.Item, seconds: dict[str, float]) -> float:
    """``item``'s measured time, else a guess from its tier markers."""
    if item.nodeid in seconds:
        return seconds[item.nodeid]
    tiers = [GUESS_BY_TIER[m.name] for m in item.iter_markers() if m.name in GUESS_BY_TIER]
    return max(tiers, default=GUESS_FAST)


def nodeid_of(classname: str, name: str) -> str | None:
    """A JUnit test case's pytest node id (its class name is the module's dotted path, then
    any classes), or None if no module matches."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        module = "/".join(parts[:cut]) + ".py"
        if (ROOT / module).is_file():
            return "::".join([module, *parts[cut:], name])
    return None


def read_junit(path: Path) -> dict[str, float]:
    """Every test case of at least ``MIN_SECONDS`` in a JUnit report, by node id."""
    out: dict[str, float] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        seconds = float(case.get("time", "0"))
        nodeid = nodeid_of(case.get("classname", ""), case.get("name", ""))
        if nodeid is not None and seconds >= MIN_SECONDS:
            out[nodeid] = round(seconds, 1)
    return out


def main(argv: list[str]) -> None:
    table = read_junit(Path(argv[0]))
    TABLE.write_text(json.dumps(dict(sorted(table.items())), indent=0) + "\n")
    print(f"{len(table)} tests of >= {MIN_SECONDS} s written to {TABLE}")


if __name__ == "__main__":
    main(sys.argv[1:])

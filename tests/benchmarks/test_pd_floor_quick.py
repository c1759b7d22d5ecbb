"""benchmarks/pd_floor.py --quick runs with the knobs the connector uses (huge pages, UCX error
mode ``none``) and reports every part (it checks the script works, not how fast)."""

from __future__ import annotations

import pytest

from tests.benchmarks.quick import run_quick


@pytest.mark.timeout(300)
def test_pd_floor_quick() -> None:
    out = run_quick("pd_floor.py", "--hugepages", "--ucx-param", "ucx_error_handling_mode=none")
    assert out["args"]["ucx_param"] == ["ucx_error_handling_mode=none"]
    rows = out["floor"]["by_bytes"]
    assert set(rows) == {"4096", "1048576"}
    for row in rows.values():
        assert all(row["us"][k] > 0 for k in ("floor", "pvr", "shm_copy"))
        assert {"data", "lease", "notif", "polls", "read_and_check"} <= row["floor_parts_us"].keys()
        assert row["read_and_check_vs_copy"] > 0 and row["floor_vs_pvr"] > 0

"""benchmarks/pd_churn.py --quick runs and counts every load's descriptors."""

from __future__ import annotations

import pytest

from tests.benchmarks.quick import run_quick


@pytest.mark.timeout(300)
def test_pd_churn_quick() -> None:
    out = run_quick("pd_churn.py", timeout=300)["churn"]
    assert out["loads"] == 3
    d = out["descriptors_per_load"]
    # at least one row per attention layer, and a whole load never one row per token
    assert out["attention_layers"] <= d["min"] <= d["median"] <= d["max"] < out["blocks_per_engine"]

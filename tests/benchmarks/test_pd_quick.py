"""benchmarks/pd.py --quick runs (it checks the script works, not how fast)."""

from __future__ import annotations

import pytest

from tests.benchmarks.quick import run_quick


@pytest.mark.timeout(600)
def test_pd_quick() -> None:
    out = run_quick("pd.py", timeout=600)
    assert out["benchmark"] == "pd"
    for arch in ("qwen3", "gemma3", "granitemoehybrid"):
        for row in out["bytes"][arch]["by_prompt_tokens"].values():
            assert 0 < row["clipped"] <= row["unclipped"]
    for row in out["throughput"].values():
        assert all(row["gbps"][k]["median"] > 0 for k in ("load", "wire", "pvr", "shm_copy"))
        assert row["descriptors"]["load"] == 4  # contiguous tables: one run per layer
    for row in out["ttft_ms"].values():
        assert row["colocated"]["median"] > 0 and row["disaggregated"]["median"] > 0

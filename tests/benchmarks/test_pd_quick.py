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
    for row in out["throughput"]["gbps"].values():
        assert row["nixl"]["median"] > 0 and row["shm_copy"]["median"] > 0
    for row in out["ttft_ms"].values():
        assert row["colocated"]["median"] > 0 and row["disaggregated"]["median"] > 0

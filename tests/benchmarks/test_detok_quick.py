"""benchmarks/detok.py --quick runs and reports per-step overhead by output length (it checks
the script works and measures every step, not how fast anything is)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import run_quick


def test_detok_quick(bench_cache: Path) -> None:
    out = run_quick("detok.py", "--cache-dir", str(bench_cache), "--baseline", timeout=600)
    assert out["benchmark"] == "detok" and out["quick"] is True and out["tokens"] == 200
    for case in out["results"].values():
        assert case["steps"] == 200  # one prefill step, then one token per step
        assert len(case["overhead_us_per_bucket"]) == 4
        assert all(us > 0 for us in case["overhead_us_per_bucket"])
        assert len(case["text_us_per_bucket"]) == 4 and all(
            us > 0 for us in case["text_us_per_bucket"]
        )

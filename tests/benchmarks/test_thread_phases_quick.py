"""benchmarks/thread_phases.py --quick runs every thread setting over both phases (it checks
that the script works, not which setting is faster)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import run_quick


def test_thread_phases_quick(bench_cache: Path) -> None:
    out = run_quick("thread_phases.py", "--cache-dir", str(bench_cache), timeout=300)
    assert out["benchmark"] == "thread_phases"
    case = out["results"]["qwen3-tiny-float32"]
    assert set(case) == {"threads_1", "threads_2", "threads_auto"}
    for row in case.values():
        assert row["prefill_wall_s"] > 0 and row["decode_wall_s"] > 0
        assert row["decode_cpu_s"] > 0

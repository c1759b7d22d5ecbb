"""benchmarks/throughput.py --quick runs and prints its JSON (it checks that the script works,
not how fast anything is)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import run_quick


def test_throughput_quick(bench_cache: Path) -> None:
    out = run_quick("throughput.py", "--cache-dir", str(bench_cache), timeout=600)
    assert out["benchmark"] == "throughput"
    assert {"cores", "torch", "threads"} <= out["machine"].keys()
    assert set(out["results"]) == {
        f"{arch}-tiny-{dtype}"
        for arch in ("qwen3", "gemma3", "granitemoehybrid")
        for dtype in ("float32", "bfloat16")
    }
    for case in out["results"].values():
        for engine in ("hybridkv", "transformers", "ratio"):
            for phase in ("prefill", "decode"):
                stats = case[engine][phase]
                assert 0 < stats["min"] <= stats["median"] <= stats["max"]
        assert 0.0 <= case["greedy_agreement"] <= 1.0

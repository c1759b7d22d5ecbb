"""benchmarks/throughput_mixed.py --quick runs and prints its JSON (it checks that the script
works, not how fast anything is)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import run_quick


def test_throughput_mixed_quick(bench_cache: Path) -> None:
    out = run_quick("throughput_mixed.py", "--cache-dir", str(bench_cache), timeout=600)
    assert out["benchmark"] == "throughput_mixed"
    assert isinstance(out["machine"]["cpu_native_bf16"], bool)
    assert set(out["results"]) == {
        f"{arch}-tiny-float32" for arch in ("qwen3", "gemma3", "granitemoehybrid")
    }
    for case in out["results"].values():
        for engine in ("hybridkv", "transformers"):
            for rate in ("tokens_per_s", "output_tokens_per_s"):
                stats = case[engine][rate]
                assert 0 < stats["min"] <= stats["median"] <= stats["max"]
        assert case["ratio"]["median"] > 0
        assert 0.0 <= case["greedy_agreement"] <= 1.0

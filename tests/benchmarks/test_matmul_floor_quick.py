"""benchmarks/matmul_floor.py --quick runs and prints its JSON (it checks that the script
works, not how fast anything is)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import run_quick


def test_matmul_floor_quick(bench_cache: Path) -> None:
    out = run_quick("matmul_floor.py", "--cache-dir", str(bench_cache), timeout=300)
    assert out["benchmark"] == "matmul_floor"
    assert set(out["results"]) == {
        f"{arch}-tiny-float32" for arch in ("qwen3", "gemma3", "granitemoehybrid")
    }
    for case in out["results"].values():
        assert case["parameters"] > 0
        assert case["decode_step_s"] > 0 and case["prefill_s"] > 0
        assert case["prefill_floor_tokens_per_s"] == 64 / case["prefill_s"]
        assert case["hybridkv_decode_step_s"] > 0 and case["hybridkv_prefill_s"] > 0

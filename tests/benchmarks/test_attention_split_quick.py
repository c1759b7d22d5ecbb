"""benchmarks/attention_split.py --quick splits the attention layer calls of B1's mixed
workload into the C call and the Python around it (that the script works and its parts add
up, not how fast anything is)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import run_quick


def test_attention_split_quick(bench_cache: Path) -> None:
    out = run_quick("attention_split.py", "--cache-dir", str(bench_cache), "--threads", "1")
    assert out["benchmark"] == "attention_split" and "cpu_flags" in out["machine"]
    kinds = out["results"]["qwen3-tiny-float32"]
    assert set(kinds) == {"mixed", "decode"}  # 6 requests through 4 slots: both kinds occur
    for parts in kinds.values():
        assert parts["calls"] > 0 and parts["c_us"] > 0
        assert parts["wrapper_us"] >= 0 and parts["layer_us"] >= 0
        total = parts["c_us"] + parts["wrapper_us"] + parts["layer_us"]
        assert abs(total - parts["total_us"]) < 1e-6 * parts["total_us"]

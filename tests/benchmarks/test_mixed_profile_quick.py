"""benchmarks/mixed_profile.py --quick runs B1's mixed workload and splits its steps by kind
(it checks that the script works and its parts add up, not how fast anything is)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import run_quick


def test_mixed_profile_quick(bench_cache: Path) -> None:
    out = run_quick("mixed_profile.py", "--cache-dir", str(bench_cache), timeout=300)
    assert out["benchmark"] == "mixed_profile" and "cpu_flags" in out["machine"]
    case = out["results"]["qwen3-tiny-float32"]
    kinds = case["kinds"]
    assert set(kinds) == {"mixed", "decode"}  # 6 requests through 4 slots: both kinds occur
    steps = sum(k["step_s"] for k in kinds.values())
    assert 0 < steps <= case["seconds"]
    for kind in kinds.values():
        assert kind["gemm_s"] > 0 and kind["attention_s"] > 0
        assert abs(kind["gemm_s"] + kind["non-GEMM_s"] - kind["step_s"]) < 1e-6
    # 6 requests of 2-8 outputs: decode steps compute one token per request, at most 4 at once
    assert kinds["decode"]["steps"] <= kinds["decode"]["tokens"] <= 4 * kinds["decode"]["steps"]

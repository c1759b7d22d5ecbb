"""benchmarks/step_profile.py --quick runs and splits a prefill and a decode step into parts
(it checks that the script works and its parts add up, not how fast anything is)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import run_quick


def test_step_profile_quick(bench_cache: Path) -> None:
    out = run_quick("step_profile.py", "--cache-dir", str(bench_cache), timeout=300)
    assert out["benchmark"] == "step_profile" and "cpu_flags" in out["machine"]
    case = out["results"]["qwen3-tiny-float32"]
    for phase in ("prefill_ms", "decode_ms"):
        parts = case[phase]
        assert parts["step"] > 0 and parts["gemm"] > 0 and parts["attention"] > 0
    prefill = case["prefill_ms"]  # one step: its parts add up exactly (decode: medians)
    assert abs(prefill["non-GEMM"] + prefill["gemm"] - prefill["step"]) < 1e-6
    assert prefill["forward other"] >= 0
    floor = case["decode_floor"]  # the decode step's GEMMs alone, same run
    assert floor["f_linear_ms"] > 0 and floor["hybridkv_ms"] > 0

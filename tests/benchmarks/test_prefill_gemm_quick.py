"""benchmarks/prefill_gemm.py --quick runs and prints its JSON (it checks that the script
works, not how fast anything is)."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_prefill_gemm_quick() -> None:
    out = run_quick("prefill_gemm.py", timeout=300)
    assert out["benchmark"] == "prefill_gemm"
    found = out["results"]["threads_1"]
    assert found["peak_gflops"] > 0
    row = found["64"]
    assert row["f_linear_cpu_speedup"] == 1.0 and row["f_linear_cpu_s"] > 0
    for variant in ("mkl_packed", "dnn_packed"):  # torch's CPU wheels carry both
        assert row[f"{variant}_cpu_s"] > 0 and row[f"{variant}_gflops"] > 0
    assert out["mkl_layout_rows_free"] is True

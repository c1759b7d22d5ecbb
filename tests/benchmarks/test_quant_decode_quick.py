"""benchmarks/quant_decode.py --quick runs and prints its JSON (it checks that the script
works, not how fast anything is)."""

from __future__ import annotations

from hybridkv.native.quant import load_quant
from tests.benchmarks.quick import run_quick
from tests.native.no_compiler import built_or_skip


def test_quant_decode_quick() -> None:
    built_or_skip(load_quant())  # the script times the native kernels
    out = run_quick("quant_decode.py", timeout=120)
    assert out["benchmark"] == "quant_decode" and out["layers"] == 2
    by_name = {r["weights"]: r for r in out["results"]}
    formats = {"Q8_0", "Q4_K", "Q6_K"}
    assert set(by_name) == {"float32"} | formats | {f"{f} int8" for f in formats}
    # the formats' sizes: 34 / 128 and 144 / 1024 of float32's bytes
    assert abs(by_name["Q8_0"]["weight_mb"] / by_name["float32"]["weight_mb"] - 34 / 128) < 1e-3
    assert abs(by_name["Q4_K"]["weight_mb"] / by_name["float32"]["weight_mb"] - 144 / 1024) < 1e-3
    assert all(r["step_ms"] > 0 and r["floor_ms"] > 0 for r in out["results"])
    assert all(r["x_paired_floor"] > 0 for r in out["results"])

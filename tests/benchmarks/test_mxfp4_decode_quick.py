"""benchmarks/mxfp4_decode.py --quick runs and prints its JSON (it checks that the script
works, not how fast anything is)."""

from __future__ import annotations

from hybridkv.native.mxfp4 import load_mxfp4
from tests.benchmarks.quick import run_quick
from tests.native.no_compiler import built_or_skip


def test_mxfp4_decode_quick() -> None:
    built_or_skip(load_mxfp4())  # the script times the native kernel
    out = run_quick("mxfp4_decode.py", timeout=120)
    assert out["benchmark"] == "mxfp4_decode" and out["layers"] == 1
    by_name = {r["weights"]: r for r in out["results"]}
    assert set(by_name) == {"float32", "mxfp4"}
    # MXFP4: 17 bytes (16 of nibbles + a scale) per 32 values, against 128 in float32
    assert abs(by_name["mxfp4"]["weight_mb"] / by_name["float32"]["weight_mb"] - 17 / 128) < 1e-3
    assert all(r["step_ms"] > 0 and r["floor_ms"] > 0 for r in out["results"])

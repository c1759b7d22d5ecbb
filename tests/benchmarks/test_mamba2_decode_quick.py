"""benchmarks/mamba2_decode.py --quick runs and prints its JSON (it checks that the script
works, not how fast anything is)."""

from __future__ import annotations

from hybridkv.native.ssm import load_ssm
from tests.benchmarks.quick import run_quick
from tests.native.no_compiler import built_or_skip


def test_mamba2_decode_quick() -> None:
    built_or_skip(load_ssm())  # the script compares against the native kernel
    out = run_quick("mamba2_decode.py", timeout=120)
    assert out["benchmark"] == "mamba2_decode"
    assert out["rows"] == 2 and out["layers"] == 2
    assert out["torch_ms"] > 0 and out["native_ms"] > 0

"""benchmarks/mamba2_prefill.py --quick runs and prints its JSON (it checks that the script
works, not how fast anything is)."""

from __future__ import annotations

from hybridkv.native.ssm_prefill import load_ssm_prefill
from tests.benchmarks.quick import run_quick
from tests.native.no_compiler import built_or_skip


def test_mamba2_prefill_quick() -> None:
    built_or_skip(load_ssm_prefill())  # the script compares against the native kernels
    out = run_quick("mamba2_prefill.py", timeout=120)
    assert out["benchmark"] == "mamba2_prefill"
    assert out["rows"] == 2 and out["len"] == 16
    assert out["torch_ms"] > 0 and out["native_ms"] > 0

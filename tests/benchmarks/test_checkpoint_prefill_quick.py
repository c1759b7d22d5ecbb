"""benchmarks/checkpoint_prefill.py --quick runs and saves what each mode should (it checks
the script works, not how fast anything is)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import run_quick


def test_checkpoint_prefill_quick(bench_cache: Path) -> None:
    out = run_quick(
        "checkpoint_prefill.py", "--cache-dir", str(bench_cache), "--modes", "off", "none", "scan"
    )
    assert out["benchmark"] == "checkpoint_prefill" and out["quick"] is True
    assert out["prompt_len"] == 512 and out["every"] == 64
    # off: nothing; none: the prompt end (496 inside, 512 at the end); scan: 7 more (64..448)
    assert out["state_saves"] == {"off": 0, "none": 2, "scan": 9}
    assert set(out["ratio_to_none"]) == {"off", "none", "scan"}

"""B5's --quick mode runs: every configuration measured, zero wrong tokens (not how fast)."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import run_quick


def test_faults_quick(bench_cache: Path) -> None:
    out = run_quick("faults.py", "--cache-dir", str(bench_cache))
    assert out["benchmark"] == "faults" and out["quick"] is True
    assert {"cores", "python", "torch", "threads"} <= out["machine"].keys()
    assert out["wrong_tokens"] == 0 and out["errored_requests"] == 0
    (ckpt,) = out["results"].values()
    configs = ckpt["configs"]
    assert {"0%", "failed 10%", "corrupt 10%", "request 10%", "timeout"} <= configs.keys()
    for name, c in configs.items():
        assert c["runs"] >= 1 and c["wrong_tokens"] == 0, name
        assert c["output_tok_s"]["median"] > 0 and c["ttft_ms"]["median"] > 0, name
    base = configs["0%"]
    assert base["failures_per_run"] == 0 and base["recomputed_tokens_per_run"] == 0
    assert base["disk_tokens_per_run"] > 0, "the measured runs load from the files"
    # every load times out: all of it is recomputed
    assert configs["timeout"]["failed_requests_per_run"] == ckpt["workload"]["num_prompts"]
    assert configs["timeout"]["recomputed_tokens_per_run"] > 0
    # the disk tier on a hostile directory (issue 18): damaged parts met, all recomputed
    hostile = ckpt["hostile_configs"]
    assert hostile["disk clean"]["disk_tokens_per_run"] > 0
    assert hostile["hostile dir"]["failures_per_run"] > 0
    assert all(c["wrong_tokens"] == 0 and c["errored_requests"] == 0 for c in hostile.values())

"""benchmarks/single_stream.py --quick: ``LLM.generate`` single-stream decode from this tree
and from a baseline tree (the same one here), each in its own worker process."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.quick import ROOT, run_quick


def test_single_stream_quick(bench_cache: Path) -> None:
    out = run_quick(
        "single_stream.py", "--cache-dir", str(bench_cache), "--baseline-src", str(ROOT / "src")
    )
    assert out["benchmark"] == "single_stream"
    case = out["results"]["qwen3-tiny"]
    assert case["LLM"]["median"] > 0 and case["LLM base"]["median"] > 0
    assert "llama-server" not in case and case["load_average"]["median"] >= 0

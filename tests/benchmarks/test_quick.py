"""The benchmarks' --quick modes run (they check that the scripts work, not how fast)."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_kv_core_quick() -> None:
    out = run_quick("kv_core.py")
    assert out["benchmark"] == "kv_core"
    assert {"cores", "python", "torch"} <= out["machine"].keys()
    assert "skipped" in out["baseline"]
    for layout in ("gemma3", "qwen35"):
        for algo in ("sha256", "xxh3_128"):
            r = out["results"][layout][algo]
            assert r["num_requests"] == 200 and r["allocation_failures"] == 0
            for op in ("hit_search", "alloc_cache_free", "hash"):
                assert r["us_per_request"][op]["median"] > 0
    # the shared prefixes are hit in full on the sliding-window layout
    assert (
        out["results"]["gemma3"]["sha256"]["hit_token_rate"]
        == out["results"]["gemma3"]["sha256"]["ideal_hit_token_rate"]
    )

"""benchmarks/routing.py --quick (B7): every policy replays the whole trace through the proxy,
every answer's cached tokens are scored against the proxy's prediction, and routing by the
index computes no more prompt tokens than round robin."""

from __future__ import annotations

import pytest

from tests.benchmarks.quick import run_quick


@pytest.mark.slow
def test_routing_quick() -> None:
    out = run_quick("routing.py", timeout=600)
    assert out["benchmark"] == "routing" and out["quick"] is True
    assert out["machine"]["cpu_flags"] is not None
    results = out["results"]
    assert set(results) == {"round_robin", "cache", "cost", "single"}
    n = results["round_robin"]["requests"]
    for policy in ("round_robin", "cache", "cost"):
        r = results[policy]
        assert r["requests"] == n and sum(r["predictions"].values()) == n
        assert 0 < r["computed_tokens"] <= r["prompt_tokens"]
    for policy in ("cache", "cost"):
        assert results[policy]["computed_tokens"] <= results["round_robin"]["computed_tokens"]

"""benchmarks/prefix_trace.py --quick: on the chat trace, message boundaries make the first
sharer of every system prompt reuse it, and checkpoints stay within their budget."""

from __future__ import annotations

from tests.benchmarks.quick import run_quick


def test_prefix_trace_quick() -> None:
    out = run_quick("prefix_trace.py")
    assert out["benchmark"] == "prefix_trace" and out["quick"] is True
    for by_mode in out["results"].values():
        off, before, messages = by_mode["off"], by_mode["before"], by_mode["messages"]
        assert off["computed_tokens"] == off["prompt_tokens"]
        assert messages["computed_tokens"] < before["computed_tokens"] < off["computed_tokens"]
        assert min(messages["first_sharer_system_reuse"].values()) >= 0.9
        assert min(before["first_sharer_system_reuse"].values()) < 0.9  # the 64-token one
        for r in (before, messages):
            assert r["checkpoint_peak_bytes"] <= r["checkpoint_budget_bytes"]

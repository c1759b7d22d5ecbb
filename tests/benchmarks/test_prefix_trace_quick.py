"""benchmarks/prefix_trace.py --quick: on the chat trace, message boundaries make the first
sharer of every system prompt reuse it, and checkpoints stay within their budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.quick import run_quick


def test_prefix_trace_quick() -> None:
    out = run_quick("prefix_trace.py")
    assert out["benchmark"] == "prefix_trace" and out["quick"] is True
    for by_mode in out["results"].values():
        off, before, messages = by_mode["off"], by_mode["before"], by_mode["messages"]
        assert off["computed_tokens"] == off["prompt_tokens"]
        assert messages["computed_tokens"] < before["computed_tokens"] < off["computed_tokens"]
        assert 0 <= messages["above_floor"] <= before["above_floor"]
        assert min(messages["first_sharer_system_reuse"].values()) >= 0.9
        assert min(before["first_sharer_system_reuse"].values()) < 0.9  # the 64-token one
        for r in (before, messages):
            assert r["checkpoint_peak_bytes"] <= r["checkpoint_budget_bytes"]
    rows = out["policy_vs_oracle"]
    assert {(r["layout"], r["trace"]) for r in rows} == {
        (layout, trace) for layout in out["results"] for trace in ("chat", "resend", "agentic")
    }
    for r in rows:  # the online policy within 10 % of the offline optimum (an upper bound)
        assert r["oracle_feasible_tokens"] <= r["oracle_saved_tokens"]
        assert 0.9 * r["oracle_saved_tokens"] <= r["saved_tokens"] <= r["prompt_tokens"]


VLLM_PYTHON = Path("/work/vllm-venv/bin/python")


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM's virtualenv is not on this machine")
def test_prefix_trace_quick_against_vllm() -> None:
    """The same trace through vLLM's Scheduler (its own venv): Mamba align mode, the block
    size vLLM forces on a hybrid, and more prompt tokens computed than hybridkv's messages."""
    out = run_quick(
        "prefix_trace.py", "--layouts", "granite_small", "--memory", "2GiB",
        "--vllm", str(VLLM_PYTHON),
    )  # fmt: skip
    by_mode = out["results"]["granite_small"]
    for label in ("vllm_default", "vllm_match_unit_16"):
        r = by_mode[label]
        assert r["config"]["mamba_cache_mode"] == "align"
        assert r["config"]["block_size_used"] > 16  # one attention page holds a Mamba state
        assert r["computed_tokens"] > by_mode["messages"]["computed_tokens"]
    assert by_mode["vllm_match_unit_16"]["config"]["hash_block_size"] == 16
    for r in out["policy_vs_oracle"]:  # vLLM's manager on every trace of the oracle table
        assert 0 <= r["vllm_saved_tokens"] <= r["prompt_tokens"]
        assert r["vllm_ratio"] == r["vllm_saved_tokens"] / r["oracle_saved_tokens"]


@pytest.mark.slow
def test_prefix_trace_resend_quick() -> None:
    """B1's batch sent twice through the engine (tiny Granite): caching off hits nothing,
    caching on hits on the second pass, and the outputs are the same."""
    out = run_quick("prefix_trace_resend.py", timeout=600)
    off, on = out["results"]["caching off"], out["results"]["branch"]
    assert off["hit_tokens_second_pass"] == 0 < on["hit_tokens_second_pass"]
    assert on["hit_tokens_second_pass"] <= on["prompt_tokens"]
    assert on["outputs_equal_caching_off"] and off["outputs_equal_caching_off"]
    assert "cpu_flags" in out["machine"]


@pytest.mark.slow
def test_prefix_trace_ttft_quick() -> None:
    """Through the real engine (tiny models): a hit of a 1,000-token prompt reuses every full
    block, and caching computes fewer of the chat trace's prompt tokens. (How much faster the
    hit is, is the benchmark's to say: on tiny models under load the CPU-time ratio fell to
    ~1.0 in one run, so no timed assertion here.)"""
    out = run_quick("prefix_trace_ttft.py", timeout=600)
    for r in out["results"].values():
        assert r["hit4k"]["hit_tokens"] == [992]  # every full 16-token block
        assert r["hit4k"]["cpu_ratio_cold_hit"] > 0
        chat = r["chat"]
        assert (
            chat["on"]["computed_tokens"] < chat["off"]["computed_tokens"] == chat["prompt_tokens"]
        )

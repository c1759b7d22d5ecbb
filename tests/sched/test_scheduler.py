"""Scheduler scenarios on every layout, with a runner double that checks every KV read."""

from __future__ import annotations

import pytest

from hybridkv.request import RequestStatus
from tests.sched.builders import make_harness, random_prompt
from tests.sched.page_runner import reference_generation

LAYOUTS = ["full", "sliding", "gemma3", "granite", "qwen35", "two_windows", "state_only", "gptoss"]


def expected(layout: str, prompt: list[int], n: int, window: int = 8) -> list[int]:
    # Only a sliding-only model sees just its window; any full or state group sees everything.
    return reference_generation(prompt, n, window if layout == "sliding" else None)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_batch_with_chunked_prefill_matches_reference(layout: str) -> None:
    h = make_harness(layout, budget=13, interval=8)
    prompts = {f"r{i}": random_prompt(i, 5 + 7 * i) for i in range(5)}
    for rid, p in prompts.items():
        h.add(rid, p, max_tokens=6)
    h.run()
    for rid, p in prompts.items():
        assert h.outputs[rid] == expected(layout, p, 6), rid
        assert h.finish[rid] == "length"
    h.assert_no_leaks()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_requests_arriving_while_others_run(layout: str) -> None:
    h = make_harness(layout, budget=16)
    prompts = {f"r{i}": random_prompt(100 + i, 9 + 5 * i) for i in range(4)}
    items = list(prompts.items())
    h.add(*items[0], max_tokens=10)
    for rid, p in items[1:]:
        h.step()
        h.step()
        h.add(rid, p, max_tokens=10)
    h.run()
    for rid, p in prompts.items():
        assert h.outputs[rid] == expected(layout, p, 10), rid
    h.assert_no_leaks()


@pytest.mark.parametrize("layout", ["full", "gemma3", "granite", "qwen35", "two_windows"])
def test_shared_prefix_hits_and_outputs_unchanged(layout: str) -> None:
    h = make_harness(layout, budget=64)
    prefix = random_prompt(7, 24)
    a, b = prefix + [1, 2], prefix + [3, 4, 5]
    h.add("a", a, max_tokens=4)
    h.run()
    req_b = h.add("b", b, max_tokens=4)
    h.run()
    assert h.outputs["b"] == expected(layout, b, 4)
    # prompt of 26 tokens, B=4: a's prompt-end checkpoint sits at 24, so every group hits 24
    assert req_b.cached_tokens == {"local": 24}
    h.assert_no_leaks()


def test_state_hybrid_64_token_prefix_hits_with_block_16() -> None:
    """vLLM inflates the block size of attention+Mamba models and hits 0 here (#40696)."""
    h = make_harness("granite", num_blocks=128, block_size=16, window=32, budget=256)
    prefix = random_prompt(11, 64)
    h.add("a", prefix + random_prompt(12, 8), max_tokens=3)
    h.run()
    req = h.add("b", prefix + random_prompt(13, 40), max_tokens=3)
    h.run()
    assert req.cached_tokens == {"local": 64}
    assert h.outputs["b"] == expected("granite", prefix + random_prompt(13, 40), 3)
    h.assert_no_leaks()


def test_junction_checkpoint_lets_the_third_request_hit() -> None:
    """a's prompt is long: no state checkpoint at 64. b's full-attention hit of 64 is a junction:
    b saves the state there, so c hits 64 in every group."""
    h = make_harness("granite", num_blocks=128, block_size=16, budget=256)
    prefix = random_prompt(21, 64)
    prompts = {n: prefix + random_prompt(22 + i, 50) for i, n in enumerate("abc")}
    reqs = {}
    for name, p in prompts.items():
        reqs[name] = h.add(name, p, max_tokens=2)
        h.run()
    assert reqs["a"].cached_tokens == {"local": 0}
    assert reqs["b"].cached_tokens == {"local": 0}
    assert reqs["c"].cached_tokens == {"local": 64}
    for name, p in prompts.items():
        assert h.outputs[name] == expected("granite", p, 2)
    h.assert_no_leaks()


def test_finished_request_leaves_a_checkpoint_after_its_answer() -> None:
    """The next turn of a conversation resumes after the previous answer (trailing slot)."""
    h = make_harness("granite", num_blocks=64, block_size=4, budget=64)
    first = random_prompt(31, 10)
    h.add("t1", first, max_tokens=7)
    h.run()
    turn2 = first + h.outputs["t1"] + random_prompt(32, 5)
    req = h.add("t2", turn2, max_tokens=3)
    h.run()
    # t1 computed 10 + 6 = 16 tokens (its last output token has no KV): last boundary 16
    assert req.cached_tokens == {"local": 16}
    assert h.outputs["t2"] == expected("granite", turn2, 3)
    h.assert_no_leaks()


@pytest.mark.parametrize("layout", ["full", "gemma3", "granite", "qwen35"])
def test_preemption_when_blocks_run_out(layout: str) -> None:
    h = make_harness(layout, num_blocks=40, budget=32, max_num_seqs=6)
    prompts = {f"r{i}": random_prompt(50 + i, 12 + i) for i in range(6)}
    for rid, p in prompts.items():
        h.add(rid, p, max_tokens=14)
    h.run()
    assert h.scheduler.num_preemptions > 0
    for rid, p in prompts.items():
        assert h.outputs[rid] == expected(layout, p, 14), rid
    h.assert_no_leaks()


def test_prefix_caching_off_computes_everything() -> None:
    h = make_harness("gemma3", caching=False)
    p = random_prompt(3, 20)
    h.add("a", p, max_tokens=3)
    h.run()
    req = h.add("b", p, max_tokens=3)
    h.run()
    assert req.cached_tokens == {"local": 0}
    assert h.outputs["b"] == h.outputs["a"] == expected("gemma3", p, 3)
    h.assert_no_leaks()


def test_full_prompt_hit_recomputes_the_last_block() -> None:
    h = make_harness("full")
    p = random_prompt(4, 16)  # 4 full blocks
    h.add("a", p, max_tokens=2)
    h.run()
    req = h.add("b", p, max_tokens=2)
    h.step()
    assert req.cached_tokens == {"local": 12}  # capped at N-1 = 15 -> 3 blocks
    assert h.runner.steps[-1].requests[0].token_ids == p[12:]
    h.run()
    h.assert_no_leaks()


def test_abort_frees_blocks_midway() -> None:
    h = make_harness("granite")
    h.add("a", random_prompt(5, 30), max_tokens=50)
    h.add("b", random_prompt(6, 20), max_tokens=5)
    for _ in range(3):
        h.step()
    h.scheduler.finish_request("a", RequestStatus.FINISHED_ABORTED)
    h.run()
    assert h.outputs["b"] == expected("granite", random_prompt(6, 20), 5)
    h.assert_no_leaks()


def test_prefill_chunks_end_at_due_checkpoints() -> None:
    h = make_harness("granite", block_size=4, interval=8, budget=100)
    h.add("a", random_prompt(8, 30), max_tokens=1)
    h.run()
    ends = [r.start_pos + len(r.token_ids) for s in h.runner.steps for r in s.requests]
    # interval boundaries 8, 16, 24 and the prompt boundary 28 (= floor(29/4)*4 = floor(30/4)*4)
    assert ends == [8, 16, 24, 28, 30]
    h.assert_no_leaks()


def test_length_limit_and_prompt_too_long() -> None:
    h = make_harness("full", max_model_len=20)
    with pytest.raises(ValueError, match="max_model_len=20"):
        h.add("long", random_prompt(9, 20))
    h.add("a", random_prompt(9, 15), max_tokens=100)
    h.run()
    assert len(h.outputs["a"]) == 5 and h.finish["a"] == "length"
    h.assert_no_leaks()

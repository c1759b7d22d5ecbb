"""The in-flight prefix rule (``sched/inflight.py``): a waiting request whose next blocks a
running prefill computes waits for them to land, then hits them -- outputs unchanged, no
deadlock when the source ends or is preempted, no leak, a bounded wait."""

from __future__ import annotations

import pytest

from hybridkv.request import Request, RequestStatus
from hybridkv.sched import inflight
from tests.sched.builders import Harness, make_harness, random_prompt
from tests.sched.page_runner import reference_generation

LAYOUTS = ["full", "sliding", "gemma3", "granite", "qwen35", "state_only"]
SHARED = 40  # tokens: 10 blocks of 4


def _pair(
    h: Harness, n: int = 6, boundaries: tuple[int, ...] = ()
) -> tuple[Request, Request, dict[str, list[int]]]:
    """``a`` and ``b`` share SHARED tokens (``boundaries``: ``a``'s cache boundaries)."""
    shared = random_prompt(7, SHARED)
    prompts = {"a": random_prompt(1, SHARED + 9, shared), "b": random_prompt(2, SHARED + 5, shared)}
    a = h.add("a", prompts["a"], max_tokens=n, cache_boundaries=boundaries)
    b = h.add("b", prompts["b"], max_tokens=n)
    return a, b, prompts


def _check_outputs(h: Harness, prompts: dict[str, list[int]], layout: str, n: int = 6) -> None:
    window = 8 if layout == "sliding" else None
    for rid, p in prompts.items():
        assert h.outputs[rid] == reference_generation(p, n, window), rid
    h.assert_no_leaks()
    assert h.scheduler.inflight.num_waiting == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_second_request_waits_then_hits_the_landed_prefix(layout: str) -> None:
    h = make_harness(layout, num_blocks=128, budget=64, interval=8)  # both in one step
    _, b, prompts = _pair(h)
    h.run()
    _check_outputs(h, prompts, layout)
    stats = h.scheduler.inflight.stats
    assert stats.num_waits == 1 and stats.num_wait_steps >= 1 and stats.num_expired == 0
    assert b.cached_tokens["local"] > 0
    assert stats.hit_tokens_gained == b.cached_tokens["local"]
    if layout == "full":
        assert b.cached_tokens["local"] == SHARED


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_hybrid_waits_only_for_a_checkpoint_due_in_the_shared_prefix(layout: str) -> None:
    """No periodic checkpoints, no caller boundary in the shared prefix: the source's only
    due boundaries are its prompt ends (past it), so on a layout with state groups nothing
    lands that ``b`` could hit and it is admitted at once; attention-only layouts wait for
    the blocks. With the caller's boundary at the shared prefix's end, every layout waits."""
    stateful = layout in ("granite", "qwen35", "state_only")
    for boundaries, waits in (((), not stateful), ((SHARED,), True)):
        h = make_harness(layout, num_blocks=128, budget=64, interval=0)
        _, b, prompts = _pair(h, boundaries=boundaries)
        h.step()
        assert (b.status is RequestStatus.WAITING) == waits, boundaries
        h.run()
        _check_outputs(h, prompts, layout)
        assert h.scheduler.inflight.stats.num_waits == int(waits), boundaries
        assert b.cached_tokens["local"] == (SHARED if waits else 0), boundaries


@pytest.mark.parametrize("layout", ["full", "granite"])
def test_without_the_rule_both_compute_the_prefix(layout: str) -> None:
    h = make_harness(layout, num_blocks=128, budget=64, interval=8)
    h.scheduler.inflight.enabled = False
    _, b, prompts = _pair(h)
    h.run()
    _check_outputs(h, prompts, layout)
    assert b.cached_tokens["local"] == 0
    assert h.scheduler.inflight.stats.num_waits == 0


def test_other_requests_go_first_while_one_waits() -> None:
    h = make_harness("full", budget=64)
    a, b, _ = _pair(h)
    c = h.add("c", random_prompt(3, 10))
    h.step()
    assert a.status is RequestStatus.RUNNING and c.status is RequestStatus.RUNNING
    assert b.status is RequestStatus.WAITING and b in h.scheduler.waiting
    h.run()
    h.assert_no_leaks()


@pytest.mark.parametrize("layout", ["full", "granite"])
def test_aborted_source_lets_the_waiting_request_proceed(layout: str) -> None:
    h = make_harness(layout, num_blocks=128, budget=64, interval=8)
    a, b, prompts = _pair(h)
    h.step()
    assert b.status is RequestStatus.WAITING
    h.scheduler.finish_request("a", RequestStatus.FINISHED_ABORTED)
    h.step()
    assert b.status is RequestStatus.RUNNING
    h.run()
    assert h.outputs["b"] == reference_generation(prompts["b"], 6)
    h.assert_no_leaks()


def test_aborted_waiting_request_is_forgotten() -> None:
    h = make_harness("full", budget=64)
    _, b, _ = _pair(h)
    h.step()
    assert h.scheduler.inflight.num_waiting == 1
    h.scheduler.finish_request(b.request_id, RequestStatus.FINISHED_ABORTED)
    assert h.scheduler.inflight.num_waiting == 0
    h.run()
    h.assert_no_leaks()


def test_preempted_source_no_deadlock() -> None:
    h = make_harness("granite", budget=64, interval=8)
    a, b, prompts = _pair(h)
    h.step()
    h.scheduler.running.remove(a)
    h.scheduler._preempt(a)  # as when blocks run out: a waits again, at the front
    h.run()
    _check_outputs(h, prompts, "granite")
    assert b.cached_tokens["local"] > 0


def test_wait_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inflight, "MAX_WAIT_STEPS", 0)
    h = make_harness("full", budget=64)
    _, b, prompts = _pair(h)
    h.run()
    _check_outputs(h, prompts, "full")
    assert h.scheduler.inflight.stats.num_expired == 1
    assert b.cached_tokens["local"] < SHARED


def test_a_request_hit_past_the_shared_chain_does_not_wait() -> None:
    h = make_harness("full", budget=64)
    shared = random_prompt(7, SHARED)
    h.add("a", random_prompt(1, SHARED + 9, shared), max_tokens=2)
    h.run()
    h.add("x", random_prompt(5, 30), max_tokens=2)  # running, shares nothing
    h.add("b", random_prompt(2, SHARED + 5, shared), max_tokens=2)
    h.run()
    assert h.scheduler.inflight.stats.num_waits == 0
    h.assert_no_leaks()

"""Scheduler <-> connector scenarios (kv-reference.md §5.5) with a scripted connector.

Loaded "KV" is the request's true tokens (garbage where a load fails) written into the
PageRunner, which checks every read, so a wrong token is caught as a wrong output."""

from __future__ import annotations

import logging

import pytest

from hybridkv.request import RequestStatus
from hybridkv.step_io import FailureReason
from tests.sched.builders import make_harness, random_prompt
from tests.sched.page_runner import reference_generation
from tests.sched.scripted_connector import Script

HYBRIDS = ["gemma3", "granite", "qwen35", "two_windows"]


def test_sync_external_hit_computes_only_the_rest() -> None:
    p = random_prompt(1, 30)
    h = make_harness("full", scripts={"a": Script(external=22, is_async=False)})
    req = h.add("a", p, max_tokens=4)
    h.step()
    first = h.runner.steps[0].requests[0]
    # the external range ends mid-block (22, B=4): exactly the remaining tokens are computed
    assert (first.start_pos, first.token_ids) == (22, p[22:])
    h.run()
    assert h.outputs["a"] == reference_generation(p, 4)
    assert req.cached_tokens == {"local": 0, "external": 22}
    assert h.connector.finished_calls == ["a"]
    h.assert_no_leaks()


@pytest.mark.parametrize("layout", ["full", *HYBRIDS])
def test_async_load_waits_then_runs(layout: str) -> None:
    p = random_prompt(2, 33)
    h = make_harness(layout, num_blocks=200, scripts={"a": Script(external=24, steps=3)})
    req = h.add("a", p, max_tokens=5)
    h.step()
    assert req.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    assert req.num_computed_tokens == 24  # local + external, set at allocation
    assert h.runner.steps == []  # nothing computed while the bytes land
    assert any(h.kv.get_unhashed_block_ids("a")), "loading blocks must stay unhashed"
    twin = h.add("twin", list(p), max_tokens=5)  # no spurious prefix hit on unloaded blocks
    h.run()
    assert twin.cached_tokens == {"local": 0}
    assert h.outputs["a"] == h.outputs["twin"] == reference_generation(p, 5)
    assert req.cached_tokens == {"local": 0, "external": 24}
    h.assert_no_leaks()


def test_full_prompt_external_hit_is_capped_at_n_minus_1() -> None:
    p = random_prompt(3, 16)
    h = make_harness("full", scripts={"a": Script(external=16, is_async=False)})
    h.add("a", p, max_tokens=3)
    h.step()
    assert h.runner.steps[0].requests[0].token_ids == p[15:]
    h.run()
    assert h.outputs["a"] == reference_generation(p, 3)
    h.assert_no_leaks()


def test_state_layout_rejects_an_external_hit_past_the_last_token() -> None:
    p = random_prompt(4, 16)
    h = make_harness("granite", scripts={"a": Script(external=16, is_async=False)})
    req = h.add("a", p, max_tokens=3)
    h.run()
    assert req.cached_tokens == {"local": 0}
    assert h.scheduler.transfer.stats.load_failures == {"rejected_past_last_token": 1}
    assert h.outputs["a"] == reference_generation(p, 3)
    h.assert_no_leaks()


def test_ask_again_later_does_not_hold_others_up() -> None:
    pa, pb = random_prompt(5, 20), random_prompt(6, 12)
    h = make_harness("full", scripts={"a": Script(external=16, ask_later=3)})
    h.add("a", pa, max_tokens=3)
    h.add("b", pb, max_tokens=3)
    h.step()
    assert [r.request_id for r in h.runner.steps[0].requests] == ["b"]
    h.run()
    assert h.connector.lookups["a"] == 4
    assert h.outputs["a"] == reference_generation(pa, 3) and h.outputs["b"] == reference_generation(
        pb, 3
    )
    h.assert_no_leaks()


@pytest.mark.parametrize("is_async", [False, True])
def test_full_attention_failure_resumes_at_the_first_bad_block(is_async: bool) -> None:
    p = random_prompt(7, 40)
    h = make_harness(
        "full", scripts={"a": Script(external=36, is_async=is_async, fail_indices={5, 7})}
    )
    h.add("a", p, max_tokens=4)
    h.run()
    computed = [(r.start_pos, len(r.token_ids)) for s in h.runner.steps for r in s.requests]
    assert (20, 20) in computed  # resumed at block 5 -> token 20, recomputing the rest
    assert h.outputs["a"] == reference_generation(p, 4)
    stats = h.scheduler.transfer.stats
    assert stats.load_failures == {FailureReason.INJECTED: 2} and stats.recomputed_tokens == 16
    h.assert_no_leaks()


@pytest.mark.parametrize("layout", HYBRIDS)
@pytest.mark.parametrize("is_async", [False, True])
@pytest.mark.parametrize("where", ["block", "request", "state"])
def test_hybrid_failure_restarts_and_outputs_are_exact(
    layout: str, is_async: bool, where: str
) -> None:
    if where == "state" and layout in ("gemma3", "two_windows"):
        pytest.skip("no state group")
    p = random_prompt(8, 41)
    script = Script(external=32, is_async=is_async, fail_indices={6} if where == "block" else set(),
                    fail_request=where == "request", fail_state=where == "state")  # fmt: skip
    h = make_harness(layout, num_blocks=128, scripts={"a": script})
    req = h.add("a", p, max_tokens=4)
    h.run()
    assert h.outputs["a"] == reference_generation(p, 4)
    assert req.cached_tokens == {"local": 0}  # the external tokens were not served
    assert h.scheduler.transfer.stats.failed_requests == 1
    h.assert_no_leaks()


@pytest.mark.parametrize("layout", ["full", "granite", "gemma3"])
@pytest.mark.parametrize("is_async", [False, True])
def test_fail_policy_finishes_only_the_affected_request(layout: str, is_async: bool) -> None:
    pa, pb = random_prompt(9, 30), random_prompt(10, 30)
    scripts = {
        "a": Script(external=24, is_async=is_async, fail_indices={2}),
        "b": Script(external=24, is_async=is_async),
    }
    h = make_harness(layout, scripts=scripts, policy="fail")
    ra = h.add("a", pa, max_tokens=3)
    h.add("b", pb, max_tokens=3)
    h.run()
    assert h.finish.get("a", ra.status.value) == "error"
    assert "kv_load_failure_policy is 'fail'" in (ra.error or "")
    assert h.outputs["b"] == reference_generation(pb, 3)
    assert sorted(h.connector.finished_calls) == ["a", "b"]  # exactly once each
    h.assert_no_leaks()


def test_async_failures_among_siblings_touch_only_the_failed_one() -> None:
    prompts = {f"r{i}": random_prompt(20 + i, 40) for i in range(3)}
    scripts = {"r0": Script(external=36, steps=2), "r1": Script(external=36, steps=2, fail_indices={3, 8}),
               "r2": Script(external=36, steps=2)}  # fmt: skip
    h = make_harness("full", scripts=scripts)
    reqs = {rid: h.add(rid, p, max_tokens=3) for rid, p in prompts.items()}
    h.step()
    h.step()
    h.step()
    assert reqs["r0"].status is RequestStatus.RUNNING and reqs["r2"].status is RequestStatus.RUNNING
    starts = {r.request_id: r.start_pos for s in h.runner.steps for r in s.requests}
    assert starts["r1"] == 12 and starts["r0"] == 36 and starts["r2"] == 36
    h.run()
    for rid, p in prompts.items():
        assert h.outputs[rid] == reference_generation(p, 3), rid
    h.assert_no_leaks()


def test_progressive_failure_reported_before_the_load_finishes() -> None:
    p = random_prompt(30, 40)
    h = make_harness(
        "full", scripts={"a": Script(external=36, steps=4, fail_indices={6}, report_early=True)}
    )
    req = h.add("a", p, max_tokens=3)
    h.step()
    h.step()
    # reported, but the load has not completed: the request keeps waiting with its blocks
    assert req.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    assert "a" in h.scheduler.transfer.failed
    h.run()
    assert h.outputs["a"] == reference_generation(p, 3)
    h.assert_no_leaks()


def test_a_request_sharing_an_unverified_block_never_hits_it() -> None:
    """vLLM #49250: B shares a prefix A is loading; A's load of a shared block fails.
    B cannot hit blocks that were never verified, and both outputs equal the fault-free run."""
    prefix = random_prompt(40, 32)
    pa, pb = prefix + random_prompt(41, 9), prefix + random_prompt(42, 7)
    h = make_harness("full", scripts={"a": Script(external=32, steps=3, fail_indices={2})})
    h.add("a", pa, max_tokens=4)
    h.step()
    rb = h.add("b", pb, max_tokens=4)
    h.run()
    assert rb.cached_tokens == {"local": 0}
    assert h.outputs["a"] == reference_generation(pa, 4)
    assert h.outputs["b"] == reference_generation(pb, 4)
    h.assert_no_leaks()


def test_invalid_block_held_as_computed_by_another_request_rolls_it_back() -> None:
    """An invalid block that another running request holds as computed rolls that request
    back too, and leaves the prefix map at once."""
    prefix = random_prompt(50, 16)
    pa, pb = prefix + random_prompt(51, 6), prefix + random_prompt(52, 20)
    h = make_harness("full", scripts={"b": Script(external=32, is_async=False, fail_indices={1})})
    h.add("a", pa, max_tokens=12)
    for _ in range(3):
        h.step()  # a's prefix blocks are cached; a keeps decoding
    h.add("b", pb, max_tokens=4)  # local hit on a's blocks 0..3, then the scripted load
    shared = h.kv.get_block_ids("a")[0][1]
    assert h.kv.pool.key[shared] is not None
    h.step()  # b's load reports a's block 1 invalid
    assert h.kv.pool.key[shared] is None  # out of the prefix map at once
    h.run()
    assert h.outputs["a"] == reference_generation(pa, 12)
    assert h.outputs["b"] == reference_generation(pb, 4)
    assert h.scheduler.transfer.stats.failed_requests == 2  # b, and a which held block 1
    h.assert_no_leaks()


def test_abort_while_loading_frees_after_the_load_lands() -> None:
    p = random_prompt(60, 30)
    h = make_harness("granite", scripts={"a": Script(external=24, steps=3)})
    h.add("a", p, max_tokens=3)
    h.step()
    h.scheduler.finish_request("a", RequestStatus.FINISHED_ABORTED)
    assert not h.kv.is_idle()  # bytes may still be landing in its blocks
    h.run()
    assert h.connector.finished_calls == ["a"]
    h.assert_no_leaks()


def test_loading_requests_count_toward_max_num_seqs() -> None:
    scripts = {f"r{i}": Script(external=16, steps=4) for i in range(3)}
    h = make_harness("full", scripts=scripts, max_num_seqs=2)
    for i in range(3):
        h.add(f"r{i}", random_prompt(70 + i, 20), max_tokens=2)
    h.step()
    assert len(h.scheduler.transfer.holding) == 2
    h.run()
    h.assert_no_leaks()


def test_producer_keeps_blocks_until_the_send_finishes() -> None:
    """P/D item 19: a prefill-side request finishes after one token, hands its blocks to the
    connector (kv_transfer_params in the request), and they are freed only on finished_sending."""
    p = random_prompt(80, 22)
    h = make_harness("granite", scripts={"a": Script(external=0, send_steps=3)})
    req = h.add("a", p, max_tokens=1)
    while not req.status.is_finished:
        h.step()  # the prefill ends at the prompt's checkpoint boundary, then samples
    assert req.status is RequestStatus.FINISHED_LENGTH
    handed = h.connector.finished_blocks["a"].block_ids
    assert req.kv_transfer_params == {"remote_block_ids": [list(t) for t in handed]}
    assert len(handed[0]) == 6  # cdiv(22, 4): every prompt block, the partial last one included
    assert not h.kv.is_idle()  # the connector owns the blocks until the send completes
    assert h.scheduler.has_unfinished_requests()
    h.run()
    assert h.connector.finished_calls == ["a"]
    h.assert_no_leaks()


def test_kv_transfer_params_reach_the_connector_and_come_back() -> None:
    """The client's kv_transfer_params (SamplingParams.extra_args) reach the connector with the
    request; what request_finished returns replaces them for the final output."""
    h = make_harness("full", scripts={"a": Script(external=0, send_steps=1)})
    sent = {"do_remote_decode": True}
    req = h.add("a", random_prompt(82, 9), max_tokens=1, kv_transfer_params=sent)
    assert req.kv_transfer_params == sent
    h.add("b", random_prompt(83, 9), max_tokens=2)
    h.run()
    assert h.connector.params_seen == {"a": sent, "b": None}
    assert isinstance(req.kv_transfer_params, dict) and "remote_block_ids" in req.kv_transfer_params
    h.assert_no_leaks()


def test_producer_short_prompt_hands_over_its_partial_block() -> None:
    """P/D item 20: a prompt shorter than one block still hands over that (partial) block."""
    h = make_harness("full", scripts={"a": Script(external=0, send_steps=1)})
    h.add("a", random_prompt(81, 3), max_tokens=1)
    h.run()
    (table,) = h.connector.finished_blocks["a"].block_ids
    assert len(table) == 1 and table[0] != 0
    h.assert_no_leaks()


def test_request_received_then_preempted_still_completes() -> None:
    """P/D item 18: after its KV arrives, a request is preempted for lack of blocks, then
    recomputes (its load is never repeated) and completes with the exact output."""
    prompts = {f"r{i}": random_prompt(90 + i, 14) for i in range(3)}
    scripts = {"r0": Script(external=12, steps=2)}
    h = make_harness("full", scripts=scripts, num_blocks=14, max_num_seqs=3, budget=64)
    for rid, p in prompts.items():
        h.add(rid, p, max_tokens=16)
    h.run()
    assert h.scheduler.num_preemptions > 0
    for rid, p in prompts.items():
        assert h.outputs[rid] == reference_generation(p, 16), rid
    h.assert_no_leaks()


def test_a_recovery_is_logged_once_per_step_with_counts(caplog: pytest.LogCaptureFixture) -> None:
    """Operators grep for vLLM's "Recovered from KV load failure" line: one per step, with the
    requests rescheduled, the tokens to recompute and the reasons."""
    p = random_prompt(7, 40)
    h = make_harness("full", scripts={"a": Script(external=36, fail_indices={5, 7})})
    h.add("a", p, max_tokens=4)
    with caplog.at_level(logging.WARNING, logger="hybridkv.sched.recovery"):
        h.run()
    lines = [r.getMessage() for r in caplog.records if r.name == "hybridkv.sched.recovery"]
    assert lines == [
        "Recovered from KV load failure: 1 request(s) rescheduled (16 tokens to recompute; "
        "injected x1)"
    ]
    h.assert_no_leaks()


def test_failing_under_policy_fail_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    p = random_prompt(7, 40)
    h = make_harness("full", scripts={"a": Script(external=36, fail_request=True)}, policy="fail")
    req = h.add("a", p, max_tokens=4)
    with caplog.at_level(logging.WARNING, logger="hybridkv.sched.recovery"):
        h.run()
    lines = [r.getMessage() for r in caplog.records if r.name == "hybridkv.sched.recovery"]
    assert lines == [
        "Failing 1 request(s) after a KV load failure (kv_load_failure_policy=fail; injected x1)"
    ]
    assert req.status.value == "error"
    h.assert_no_leaks()

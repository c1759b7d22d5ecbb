"""``Recovery`` plans, the scheduler applies: the plan of a failed load names what to do and
leaves every queue as it was until ``Scheduler`` applies it."""

from __future__ import annotations

from hybridkv.engine.step import run_step
from hybridkv.request import RequestStatus
from hybridkv.sched.recovery import Action
from tests.sched.builders import make_harness, random_prompt
from tests.sched.scripted_connector import Script


def test_a_failed_load_is_planned_then_applied_by_the_scheduler() -> None:
    h = make_harness(
        "full", scripts={"a": Script(external=24, is_async=False, fail_indices={2})}, policy="fail"
    )
    req = h.add("a", random_prompt(9, 30), max_tokens=3)
    sched = h.scheduler
    assert sched.recovery is not None and h.worker is not None
    planned = []
    apply_plan = sched._apply

    def spy(plan):  # noqa: ANN001, ANN202
        planned.append((plan.discarded, [(m.action, m.request.request_id) for m in plan.moves]))
        assert req in sched.running and not req.status.is_finished  # nothing moved yet
        apply_plan(plan)

    sched._apply = spy  # type: ignore[method-assign]
    run_step(sched, h.runner, h.worker)
    assert planned == [({"a"}, [(Action.FAIL, "a")])]  # its step output is void too
    assert req.status is RequestStatus.FINISHED_ERROR and req not in sched.running
    assert "kv_load_failure_policy is 'fail'" in (req.error or "")
    h.run()
    h.assert_no_leaks()

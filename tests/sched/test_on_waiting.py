"""The ``on_waiting`` seam: once per step the connector hears which requests carrying
``kv_transfer_params`` still wait for admission (behind a blocked queue head too), a last empty
list when none are left, and nothing at all while no waiting request has params."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import pytest

from hybridkv.connectors.base import Capabilities, KVConnectorRequest
from hybridkv.connectors.config import KVTransferConfig
from hybridkv.connectors.fault.connector import FaultInjectionScheduler
from hybridkv.connectors.multi.config import ChildConfig, MultiConfig
from hybridkv.connectors.multi.connector import MultiConnectorScheduler
from hybridkv.request import RequestStatus
from tests.kv.builders import make_layout
from tests.sched.builders import make_harness, random_prompt
from tests.sched.scripted_connector import Script, ScriptedScheduler


def test_the_connector_hears_every_waiting_request_with_params_each_step() -> None:
    h = make_harness("full", scripts={"a": Script(external=0)}, max_num_seqs=1)
    calls: list[list[str]] = []

    def record(requests: Sequence[KVConnectorRequest]) -> None:
        calls.append([r.request_id for r in requests])

    assert h.connector is not None
    h.connector.on_waiting = record  # type: ignore[method-assign]
    h.add("a", random_prompt(1, 20), max_tokens=6)  # runs first: the queue head blocks
    h.step()
    assert calls == []  # nothing waits with params: no call
    h.add("b", random_prompt(2, 20), max_tokens=3, kv_transfer_params={"x": 1})
    h.add("c", random_prompt(3, 20), max_tokens=3)
    h.add("d", random_prompt(4, 20), max_tokens=3, kv_transfer_params={"x": 2})
    h.step()
    assert calls == [["b", "d"]]  # b is the blocked head; d, behind it, is heard too
    while "b" not in h.outputs:
        h.step()
    assert calls[-1] == ["d"]  # b was admitted
    h.run()
    assert calls[-1] == [] and calls.count([]) == 1  # one empty list ends it, then no calls
    assert h.outputs.keys() == {"a", "b", "c", "d"}
    h.assert_no_leaks()


class Recorder(ScriptedScheduler):
    def __init__(self) -> None:
        super().__init__({})
        self.heard: list[list[str]] = []

    def on_waiting(self, requests: Sequence[KVConnectorRequest]) -> None:
        self.heard.append([r.request_id for r in requests])


def multi_over(*children: ScriptedScheduler) -> MultiConnectorScheduler:
    """A MultiConnector scheduler half over ``children`` (named c0, c1...)."""
    names = [ChildConfig(f"c{i}", 1.0, cast(KVTransferConfig, None), True) for i in range(len(children))]  # fmt: skip
    return MultiConnectorScheduler(MultiConfig(tuple(names)), list(children), make_layout("full"))


def test_the_wrappers_pass_it_through() -> None:
    """FaultInjection hands it to its inner connector, MultiConnector to every child."""
    h = make_harness("full")
    reqs = [cast(KVConnectorRequest, h.add("a", random_prompt(1, 8)))]
    inner = Recorder()
    leases = FaultInjectionScheduler(inner).capabilities().leases
    assert leases is not None
    leases.on_waiting(reqs)
    assert inner.heard == [["a"]]
    children = [Recorder(), Recorder()]
    multi_leases = multi_over(*children).capabilities().leases
    assert multi_leases is not None
    multi_leases.on_waiting(reqs)
    assert [c.heard for c in children] == [[["a"]], [["a"]]]


def test_a_request_dropped_without_kv_is_reported_once() -> None:
    """Aborted while it waits (it never held KV, so ``request_finished`` does not run for it):
    the connector hears ``request_dropped``, for requests with params only; one that held KV
    gets ``request_finished`` instead."""
    h = make_harness("full", scripts={"a": Script(external=0)}, max_num_seqs=1)
    dropped: list[str] = []
    assert h.connector is not None
    h.connector.request_dropped = lambda r: dropped.append(r.request_id)  # type: ignore[method-assign]
    h.add("a", random_prompt(1, 20), max_tokens=6)
    h.step()  # a runs; b and c wait behind it
    h.add("b", random_prompt(2, 20), max_tokens=3, kv_transfer_params={"x": 1})
    h.add("c", random_prompt(3, 20), max_tokens=3)
    h.step()
    h.scheduler.finish_request("b", RequestStatus.FINISHED_ABORTED)
    h.scheduler.finish_request("c", RequestStatus.FINISHED_ABORTED)
    h.scheduler.finish_request("a", RequestStatus.FINISHED_ABORTED)  # held KV: not dropped
    assert dropped == ["b"]
    h.run()
    h.assert_no_leaks()


def test_a_connector_with_items_keeps_an_idle_engine_stepping() -> None:
    h = make_harness("full", scripts={})
    assert h.connector is not None
    pending = [True]
    h.connector.has_pending = lambda: pending[0]  # type: ignore[method-assign]
    assert h.scheduler.has_unfinished_requests()  # no request, but the connector has items
    pending[0] = False
    assert not h.scheduler.has_unfinished_requests()


def test_the_wrappers_pass_drops_and_pending_through() -> None:
    h = make_harness("full")
    req = cast(KVConnectorRequest, h.add("a", random_prompt(1, 8)))
    inner = Recorder()
    dropped: list[str] = []
    inner.request_dropped = lambda r: dropped.append(r.request_id)  # type: ignore[method-assign]
    inner.has_pending = lambda: True  # type: ignore[method-assign]
    wrapped = FaultInjectionScheduler(inner)
    leases = wrapped.capabilities().leases
    assert leases is not None
    leases.request_dropped(req)
    assert dropped == ["a"] and wrapped.has_pending()
    multi = multi_over(Recorder(), inner)
    multi.request_dropped(req)
    assert dropped == ["a", "a"] and multi.has_pending()
    assert not multi_over(Recorder()).has_pending()


def test_the_hook_groups_are_asked_once_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """``capabilities()`` is resolved when ``KVTransfer`` is built, never per step."""
    asked: list[str] = []
    original = ScriptedScheduler.capabilities

    def counting(self: ScriptedScheduler) -> Capabilities:
        asked.append("capabilities")
        return original(self)

    monkeypatch.setattr(ScriptedScheduler, "capabilities", counting)
    h = make_harness("full", scripts={"a": Script(external=0)})
    h.add("a", random_prompt(1, 20), max_tokens=4, kv_transfer_params={"x": 1})
    h.add("b", random_prompt(2, 20), max_tokens=4)
    h.run()
    assert asked == ["capabilities"] and h.outputs.keys() == {"a", "b"}
    h.assert_no_leaks()

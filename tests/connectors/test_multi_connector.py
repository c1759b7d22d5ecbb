"""``MultiConnector``: the three selections with injected estimates, the running estimates,
loads and saves through real children, and start-up errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hybridkv.connectors.base import BaseConnectorScheduler, Capabilities, KeptKV, RequestBlocks
from hybridkv.connectors.multi.connector import MultiConnectorScheduler
from hybridkv.connectors.multi.select import (
    Hit,
    LoadEstimate,
    PrefillEstimate,
    Selection,
    choose,
    load_bytes,
    worth_waiting,
)
from hybridkv.step_io import ConnectorMetadata
from tests.connectors.helpers import Engine, FakeRequest, make_layout, make_request, table
from tests.connectors.offloading.helpers import DST, SRC, offload_config
from tests.support.stats import counters_with_children

LAYOUT = make_layout("hybrid")


def pick(selection: Selection, hits: list[tuple[int, int]], **kw: Any) -> int | None:
    """The child chosen among ``(child, tokens)`` hits, 3 children, 100 tokens to compute."""
    estimates = kw.get("estimates") or [LoadEstimate(1e-3, 1e9) for _ in range(3)]
    prefill = PrefillEstimate(kw.get("s_per_token", 1e-3))
    weights = kw.get("weights", [1.0, 1.0, 1.0])
    found = [Hit(c, n, True) for c, n in hits]
    chosen = choose(selection, found, weights, estimates, prefill, LAYOUT, 100)
    return None if chosen is None else chosen.child


def test_first_takes_the_first_child_with_a_hit() -> None:
    assert pick(Selection.FIRST, [(0, 0), (1, 16), (2, 64)]) == 1
    assert pick(Selection.FIRST, [(0, 0), (1, 0), (2, 0)]) is None


def test_weighted_maximises_tokens_times_weight() -> None:
    assert pick(Selection.WEIGHTED, [(0, 32), (1, 64), (2, 48)]) == 1
    assert pick(Selection.WEIGHTED, [(0, 32), (1, 64), (2, 48)], weights=[3.0, 1.0, 1.0]) == 0
    assert pick(Selection.WEIGHTED, [(0, 64), (1, 64), (2, 0)]) == 0  # ties: config order


def test_cost_prefers_a_fast_shorter_hit_to_a_slow_longer_one() -> None:
    slow, fast = LoadEstimate(0.5, 1e9), LoadEstimate(1e-3, 1e9)
    estimates = [slow, fast, fast]
    assert pick(Selection.COST, [(0, 96), (1, 88), (2, 0)], estimates=estimates) == 1
    # the slow child is worth it once recompute of the difference costs more than its latency
    many = [(0, 96), (1, 8), (2, 0)]
    assert pick(Selection.COST, many, estimates=estimates, s_per_token=0.01) == 0
    assert pick(Selection.FIRST, [(0, 96), (1, 88)], estimates=estimates) == 0
    assert pick(Selection.WEIGHTED, [(0, 96), (1, 88)], estimates=estimates) == 0


def test_cost_skips_a_hit_slower_to_load_than_to_recompute() -> None:
    crawling = [LoadEstimate(0.2, 1e6) for _ in range(3)]
    assert pick(Selection.COST, [(0, 96), (1, 64)], estimates=crawling, s_per_token=1e-4) is None
    assert pick(Selection.COST, [(0, 96), (1, 64)], estimates=crawling, s_per_token=0.1) == 0


def test_load_estimate_fits_latency_and_bandwidth() -> None:
    estimate = LoadEstimate()
    for nbytes in [1 << 20, 4 << 20, 2 << 20, 8 << 20] * 3:
        estimate.add(nbytes, 0.02 + nbytes / 2e8)
    assert estimate.latency == pytest.approx(0.02, rel=1e-3)
    assert estimate.bandwidth == pytest.approx(2e8, rel=1e-3)
    one_size = LoadEstimate(bandwidth=1e9)
    one_size.add(1 << 20, 0.5)  # one size: the time beyond the bandwidth is latency
    assert one_size.latency == pytest.approx(0.5 - (1 << 20) / 1e9)


def test_prefill_estimate_is_the_lowest_recent_step_cost() -> None:
    prefill = PrefillEstimate()
    prefill.add(4, 10.0)  # a decode step: says nothing about prefill
    assert prefill.num_samples == 0
    prefill.add(100, 5.0)  # a warm-up step
    assert prefill.s_per_token == pytest.approx(0.05)
    prefill.add(100, 0.1)
    prefill.add(10_000, 1e6)  # a step followed by a long pause
    assert prefill.s_per_token == pytest.approx(0.001)
    for _ in range(PrefillEstimate.WINDOW):
        prefill.add(100, 0.2)  # the machine got slower: the old fast sample ages out
    assert prefill.s_per_token == pytest.approx(0.002)


def test_load_bytes_caps_windows_and_adds_states() -> None:
    full = make_layout("full")
    assert load_bytes(full, 16) == 4 * full.page_bytes
    assert load_bytes(LAYOUT, 400) < load_bytes(make_layout("full"), 400) * 2


def multi(selection: str, *children: dict[str, Any]) -> dict[str, Any]:
    return {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": list(children), "selection": selection},
    }


def child(name: str, **extra: Any) -> dict[str, Any]:
    return {**offload_config(**extra), "name": name}


def counters(engine: Engine) -> dict[str, float]:
    """Both halves' counters, each child's also as ``connector.<name>.<counter>``."""
    totals: dict[str, float] = {}
    for half in (engine.scheduler, engine.worker):
        for name, value in counters_with_children(half.take_stats()).items():
            totals[name] = totals.get(name, 0.0) + value
    return totals


class FixedPrefill(PrefillEstimate):
    """A compute cost the test sets: the steps' measured times (which, on a fast machine,
    would make recomputing 16 tokens look cheaper than any load) are not taken in."""

    def add(self, tokens: int, seconds: float) -> None:
        pass


def sched(engine: Engine) -> MultiConnectorScheduler:
    assert isinstance(engine.scheduler, MultiConnectorScheduler)
    return engine.scheduler


def save_prompt(engine: Engine, req: FakeRequest) -> None:
    start, blocks = 0, table(LAYOUT, SRC, {2: 0})
    for end in (8, 16, 18):
        engine.worker.save(engine.scheduler.build_connector_meta([(req, start, end, blocks)]))
        start = end
    assert engine.worker.wait_for_saves(5.0)


@pytest.mark.parametrize(("selection", "chosen"), [("first", "a"), ("cost", "b")])
def test_loads_come_from_the_chosen_child_and_saves_go_to_all(selection: str, chosen: str) -> None:
    config = multi(selection, child("a"), child("b"))
    engine = Engine(config, LAYOUT, seed=1)
    sched(engine).estimates[0] = LoadEstimate(10.0, 1e9)  # a: very slow
    sched(engine).prefill = FixedPrefill(1.0)  # recompute is slower still
    req = make_request("a", 18)
    save_prompt(engine, req)
    want = engine.blocks_bytes([1, 2, 3, 4, 8, 9]).clone()
    got = counters(engine)
    assert got["connector.a.stores.cpu"] == 2 == got["connector.b.stores.cpu"]
    load = FakeRequest("l", req.all_token_ids)
    num, _, _ = engine.load(load, table(LAYOUT, DST, {2: 3}))
    assert num == 16 and engine.scheduler.get_hit_sources(load, 16) == {"cpu": 16}
    out = engine.finish("l")
    assert not out.invalid_block_ids and not out.invalid_state
    assert torch.equal(engine.blocks_bytes([11, 12, 13, 14, 16, 17]), want)
    got = counters(engine)
    assert got[f"selected_tokens.{chosen}"] == 16
    assert got[f"connector.{chosen}.hits.cpu"] == 2
    other = "b" if chosen == "a" else "a"
    assert f"connector.{other}.hits.cpu" not in got


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"connectors": []}, "non-empty list"),
        ({"connectors": [offload_config()], "selection": "best"}, "selection"),
        ({"connectors": [offload_config(), offload_config()], "colour": 1}, "unknown keys"),
        ({"connectors": [{**offload_config(), "load_weight": -1}]}, "load_weight"),
        ({"connectors": [multi("first", offload_config())]}, "cannot nest"),
        (
            {"connectors": [{**offload_config(), "name": "x"}, {**offload_config(), "name": "x"}]},
            "differ",
        ),
        ({"connectors": [offload_config(chunk_tokens=6)]}, r"connectors\[0\]: .*chunk_tokens"),
        (  # parsed fine, but a unit of this layout (hybrid groups, state) does not fit
            {"connectors": [offload_config(), {**offload_config(cpu=64), "name": "tiny"}]},
            "child 'tiny'.*cannot serve this engine's layout.*cpu_bytes",
        ),
        (  # parsed fine, but cannot be built on this machine
            {"connectors": [offload_config(disk=Path("/proc/no-such/kv"))]},
            "child '0.OffloadingConnector'.*disk_path",
        ),
    ],
)
def test_bad_config_is_a_clear_start_up_error(extra: dict[str, Any], message: str) -> None:
    config = {"kv_connector": "MultiConnector", "kv_connector_extra_config": extra}
    with pytest.raises(ValueError, match=message):
        Engine(config, LAYOUT)


class KeepingChild:
    """A child that delays the free (``delay``) and keeps ``kept`` (None: everything)."""

    def __init__(self, delay: bool, kept: KeptKV | None) -> None:
        self.delay, self.kept, self.asked = delay, kept, 0

    def request_finished(self, request: Any, blocks: Any) -> tuple[bool, dict[str, Any] | None]:
        return self.delay, None

    def get_kept_kv(self, request: Any) -> KeptKV | None:
        self.asked += 1
        return self.kept

    def get_first_whole_blocks(self, request: Any, num_external: int) -> tuple[int, ...] | None:
        return None

    def capabilities(self) -> Capabilities:
        return Capabilities(partial=self)


@pytest.mark.parametrize(
    ("children", "expected"),
    [
        ([(True, KeptKV(64, 40)), (False, None)], KeptKV(64, 40)),  # a NIXL child + offloading
        ([(True, KeptKV(64, 40)), (True, KeptKV(80, 56))], KeptKV(80, 40)),  # both: the union
        ([(True, KeptKV(64, 40)), (True, None)], None),  # one keeps everything
        ([(False, None), (False, None)], None),  # nobody delayed
    ],
)
def test_kept_kv_is_what_the_delaying_children_keep(
    children: list[tuple[bool, KeptKV | None]], expected: KeptKV | None
) -> None:
    config = sched(Engine(multi("first", child("a"), child("b")), LAYOUT)).config
    doubles = [KeepingChild(*c) for c in children]
    scheduler = MultiConnectorScheduler(config, doubles, LAYOUT)  # type: ignore[arg-type]
    req = make_request("r", 16)
    delay, _ = scheduler.request_finished(req, table(LAYOUT, SRC, {2: 0}))
    assert delay == any(d.delay for d in doubles)
    assert scheduler.get_kept_kv(req) == expected
    assert [d.asked for d in doubles] == [int(d.delay) for d in doubles]  # only delaying ones
    assert scheduler.get_kept_kv(req) is None  # asked once per finished request, then forgotten


class LookupChild(BaseConnectorScheduler):
    """A child whose lookup answers ``found`` (None: still looking, ask again)."""

    def __init__(self, found: tuple[int, bool] | None) -> None:
        self.found = found
        self.asked = 0
        self.loads: list[int] = []
        self.whole: tuple[int, ...] | None = None  # get_first_whole_blocks' answer
        self.seen: list[RequestBlocks] = []  # the blocks build_connector_meta was given

    def get_first_whole_blocks(self, request: Any, num_external: int) -> tuple[int, ...] | None:
        return self.whole

    def get_kept_kv(self, request: Any) -> KeptKV | None:
        return None

    def get_num_new_matched_tokens(self, request: Any, num_local: int) -> tuple[int, bool] | None:
        self.asked += 1
        return self.found

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external: int) -> None:
        self.loads.append(num_external)

    def build_connector_meta(self, scheduled: Any) -> ConnectorMetadata:
        self.seen += [blocks for _, _, _, blocks in scheduled]
        return ConnectorMetadata()

    def request_finished(self, request: Any, blocks: Any) -> tuple[bool, dict[str, Any] | None]:
        return False, None


def lookup(selection: str, *answers: tuple[int, bool] | None, s_per_token: float = 1e-3) -> Any:
    """A MultiConnector scheduler over children answering ``answers``, fast loads, a fixed
    prefill cost; returns (scheduler, request of 100 tokens, children)."""
    config = sched(Engine(multi(selection, child("a"), child("b")), LAYOUT)).config
    doubles = [LookupChild(a) for a in answers]
    scheduler = MultiConnectorScheduler(config, list(doubles), LAYOUT)
    scheduler.estimates = [LoadEstimate(1e-3, 1e9) for _ in doubles]
    scheduler.prefill = FixedPrefill(s_per_token)
    return scheduler, make_request("r", 100), doubles


@pytest.mark.parametrize("selection", ["first", "weighted", "cost"])
def test_a_full_hit_is_taken_while_another_child_still_looks(selection: str) -> None:
    """99 of 100 tokens (all but the last, computed for its logits) from child b: child a,
    still looking, could not load more, so the request is not deferred."""
    scheduler, req, doubles = lookup(selection, None, (99, True))
    assert scheduler.get_num_new_matched_tokens(req, 0) == (99, True)
    assert all(d.asked == 1 for d in doubles)  # every child asked, the pending one too
    assert "waited.a" not in counters_with_children(scheduler.take_stats())
    scheduler.update_state_after_alloc(req, table(LAYOUT, DST, {2: 3}), 99)
    assert [d.loads for d in doubles] == [[0], [99]]  # b loads, a (still looking) does not


def test_a_small_hit_waits_for_a_pending_child_while_waiting_pays() -> None:
    """Child b has 16 tokens, child a is still looking. With prefill at 1 ms a token, a full
    hit from a (1 ms latency) would save far more than a round trip: ask again. Once a answers
    96, it is chosen."""
    scheduler, req, doubles = lookup("cost", None, (16, True))
    assert scheduler.get_num_new_matched_tokens(req, 0) is None
    assert counters_with_children(scheduler.take_stats())["waited.a"] == 1
    doubles[0].found = (96, True)
    assert scheduler.get_num_new_matched_tokens(req, 0) == (96, True)


def test_a_small_hit_is_taken_when_waiting_cannot_pay() -> None:
    """The same answers, but child a's round trip (2 s) costs more than recomputing what a
    full hit would save (84 tokens at 1 ms): take b's 16 tokens now."""
    scheduler, req, _ = lookup("cost", None, (16, True))
    scheduler.estimates[0] = LoadEstimate(2.0, 1e9)
    assert scheduler.get_num_new_matched_tokens(req, 0) == (16, True)
    # nothing anywhere yet, a short prompt: recomputing beats any wait too
    scheduler, req, _ = lookup("cost", None, (0, False), s_per_token=1e-6)
    assert scheduler.get_num_new_matched_tokens(req, 0) == (0, False)


def test_worth_waiting_follows_each_selection() -> None:
    fast = [LoadEstimate(1e-3, 1e9) for _ in range(3)]
    args = ([1.0, 1.0, 3.0], fast, PrefillEstimate(1e-3), LAYOUT, 100)
    small = Hit(1, 16, True)
    assert not worth_waiting(Selection.COST, Hit(1, 99, True), [0], *args, 99)  # full hit
    assert not worth_waiting(Selection.COST, small, [], *args, 99)  # nobody pending
    assert worth_waiting(Selection.COST, small, [0], *args, 99)
    assert worth_waiting(Selection.FIRST, small, [0], *args, 99)  # a would come first
    assert not worth_waiting(Selection.FIRST, small, [2], *args, 99)  # c would not
    assert worth_waiting(Selection.WEIGHTED, small, [0], *args, 99)  # 99 x 1 > 16 x 1
    assert not worth_waiting(Selection.WEIGHTED, Hit(2, 40, True), [0], *args, 99)  # < 40 x 3


def test_blocks_a_load_filled_in_part_are_hidden_from_every_childs_saves() -> None:
    """Child a loads 40 tokens after a local hit of 8 and says the sliding group's entries
    before 5 got only part of their bytes (a window's first block): while the request lives,
    no child (a tier that saves) sees entries 2..4 of that table, so none stores them."""
    scheduler, req, doubles = lookup("cost", (40, True), (0, False))
    assert scheduler.get_num_new_matched_tokens(req, 8) == (40, True)
    req.num_computed_tokens = 48
    blocks = RequestBlocks((list(range(1, 14)), list(range(21, 34))), (3,))
    scheduler.update_state_after_alloc(req, blocks, 40)
    doubles[0].whole = (2, 5)  # full-attention group: from the local hit on, all whole
    assert scheduler.get_first_whole_blocks(req, 40) == (2, 5)
    scheduler.build_connector_meta([(req, 48, 60, blocks)])
    hidden = [21, 22, 0, 0, 0, *range(26, 34)]
    for child in doubles:
        assert child.seen[-1].block_ids == (list(range(1, 14)), hidden)
    assert blocks.block_ids[1][2] == 23  # the scheduler's own table is untouched
    scheduler.request_finished(req, blocks)
    scheduler.build_connector_meta([(req, 60, 61, blocks)])
    assert doubles[1].seen[-1] is blocks

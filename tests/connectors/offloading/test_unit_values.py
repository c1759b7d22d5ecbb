"""Issue 29: the tiers keep restore units by the checkpoint book's value model
(``ValuePolicy``), not by LRU: reused heads and message ends survive a flood of one-shot
prompts, low-value saves are skipped (counted), stale units still go."""

from __future__ import annotations

import pytest

from hybridkv.connectors.offloading.policies import AGE_HORIZON, ValuePolicy
from hybridkv.connectors.offloading.store_planning import UnitKinds
from hybridkv.kv.checkpoints import CheckpointKind
from tests.connectors.helpers import FakeRequest, make_layout, make_request

from .helpers import C, OffloadEngine, offload_config
from .test_tiers import UNIT, hit, load_all, store

PERIODIC, PROMPT, CALLER = CheckpointKind.PERIODIC, CheckpointKind.PROMPT, CheckpointKind.CALLER


def engine(policy: str, units: int = 4) -> OffloadEngine:
    return OffloadEngine(offload_config(cpu=units * UNIT, eviction=policy), make_layout("full"))


def flood(eng: OffloadEngine, num: int) -> None:
    """One-shot prompts of two units each (a periodic unit, then the prompt's last)."""
    for i in range(num):
        store(eng, make_request(f"s{i}", 18, first_token=200 * (i + 1)), first_block=10)


def test_unit_kinds_follow_the_request() -> None:
    req = FakeRequest("r", list(range(1, 35)), cache_boundaries=(10, 40))  # 34 tokens
    kinds = UnitKinds.of(req, C)
    assert [kinds.kind(end) for end in (8, 16, 24, 32)] == [CALLER, PERIODIC, PERIODIC, PROMPT]
    assert kinds.ahead(8) == {CALLER, PROMPT}  # 10 rounds down to 8; 40 > P is ignored
    assert kinds.ahead(16) == {PERIODIC, PROMPT} and kinds.ahead(40) == {PERIODIC}


@pytest.mark.parametrize(("policy", "survives"), [("lru", False), ("value", True)])
def test_a_reused_prefix_survives_a_flood_of_one_shot_prompts(policy: str, survives: bool) -> None:
    eng = engine(policy)
    a = make_request("a", 18)
    store(eng, a)
    assert load_all(eng, a) == 16  # both units served a hit
    flood(eng, 3)  # 6 units through a tier of 4
    assert (hit(eng, a) == 16) is survives  # value: the flood recycled its own units
    eng.assert_clean()


@pytest.mark.parametrize(("policy", "kept"), [("lru", 0), ("value", 8)])
def test_a_message_end_survives_a_flood_never_reused(policy: str, kept: int) -> None:
    """Nothing was reused yet: the caller boundary (a message end at 8) outranks the flood's
    periodic and prompt-end units (the priors; prompt ends never hit learn lower), so a
    branch from it still hits."""
    eng = engine(policy)
    tokens = list(range(1, 19))
    store(eng, FakeRequest("a", tokens, cache_boundaries=(8,)))
    flood(eng, 3)
    branch = FakeRequest("b", tokens[:8] + list(range(900, 910)))
    assert hit(eng, branch) == kept
    eng.assert_clean()


def test_a_save_that_would_evict_only_reused_units_is_skipped_and_counted() -> None:
    eng = engine("value", units=2)
    a = make_request("a", 18)
    store(eng, a)
    assert load_all(eng, a) == 16
    flood(eng, 1)  # both of its units could only displace a's: skipped
    assert hit(eng, a) == 16
    counters = eng.counters()
    assert counters["stores_skipped_low_value.cpu"] == 2
    assert counters["stores_skipped:low_value"] == 2 and "evictions.cpu" not in counters
    eng.assert_clean()


def test_policy_orders_by_class_then_recency_and_stale_units_go_first() -> None:
    policy = ValuePolicy(2)  # fresh rates are the priors: caller 0.6 > prompt 0.4 > periodic 0.2
    for key, kind in (("c", CALLER), ("p", PERIODIC), ("q", PROMPT), ("p2", PERIODIC)):
        policy.label(key, kind)
        policy.insert(key)
    assert policy.candidates() == ["p", "p2", "q", "c"]
    policy.resume("p")  # a hit: (periodic, 1) outranks (periodic, 0)
    assert policy.candidates()[0] == "p2" and policy.rank("p") > policy.rank("p2")
    policy.share("q")  # two resident units continue it: a junction (0.6)
    assert policy.of["q"] == (CheckpointKind.JUNCTION, 0)
    for i in range(AGE_HORIZON * 2):  # the tier stored 4 capacities since c was used
        policy.insert(f"n{i}")
    assert policy.candidates()[0] == "c"
    assert policy.rank("c") < policy.rank_of(PERIODIC, 0)  # keeps no newcomer out
    for key in list(policy.of):
        policy.remove(key, evicted=True)
    assert not policy.classes and not policy.of


def test_labels_apply_only_to_the_unit_they_name() -> None:
    policy = ValuePolicy(4)
    policy.label("x", CALLER)
    policy.insert("y")  # not the labelled one: a periodic unit
    policy.insert("x")  # the label was consumed by the insert before
    assert policy.of == {"y": (PERIODIC, 0), "x": (PERIODIC, 0)}


def test_the_tier_learns_which_kinds_it_serves() -> None:
    """Prompt ends that get hits rise above the caller prior; those never hit sink."""
    served, idle = ValuePolicy(8), ValuePolicy(8)
    for i in range(6):
        for policy in (served, idle):
            policy.label(i, PROMPT)
            policy.insert(i)
        served.resume(i)
    assert served.rank_of(PROMPT, 0) > served.rank_of(CALLER, 0)
    assert idle.rank_of(PROMPT, 0) < idle.rank_of(PERIODIC, 0)


def test_a_request_with_the_most_boundaries_classes_its_units_once() -> None:
    """Client boundaries are bounded at the boundary (4,096); past the prompt they are
    ignored, duplicates and unsorted ones change nothing."""
    tokens = list(range(1, 35))
    bounds = tuple([10] * 2000 + list(range(4000, 2000, -1)) + [33, 1])
    kinds = UnitKinds.of(FakeRequest("r", tokens, cache_boundaries=bounds), C)
    assert kinds.caller_ends == frozenset({0, 8, 32})
    assert [kinds.kind(end) for end in (8, 16, 24, 32)] == [CALLER, PERIODIC, PERIODIC, PROMPT]
    assert kinds.ahead(16) == {PERIODIC, PROMPT, CALLER}  # the unit ending at 32 is named too

"""The order each policy gives, the work a decision books on an engine and gives back, the
cached tokens read from an answer, and the checks on an engine's info answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hybridkv.kv_events.config import KVEventsConfig
from hybridkv.kv_events.info import describe_engine
from hybridkv.proxy.routing.decision import (
    RECOMPUTE_WEIGHT,
    Decision,
    Policy,
    Reason,
    order_engines,
)
from hybridkv.proxy.routing.engine_info import parse_engine_info
from hybridkv.proxy.routing.engines import EngineState
from hybridkv.proxy.routing.index import EngineIndex
from hybridkv.proxy.routing.subscriber import EventSubscriber
from tests.kv.builders import make_layout

URLS = ["http://a", "http://b", "http://c"]


def states(**queued: int) -> dict[str, EngineState]:
    out = {u: EngineState(u, EngineIndex(10)) for u in URLS}
    for name, n in queued.items():
        out[f"http://{name}"].queued_tokens = n
    return out


def test_each_policy_orders_as_documented() -> None:
    healthy = dict.fromkeys(URLS, True)
    predicted = {"http://b": 64, "http://c": 32}
    engines = states(b=10_000)  # b holds the most but is busy
    order = order_engines(Policy.ROUND_ROBIN, URLS, healthy, engines, predicted, 100)
    assert order == URLS
    assert order_engines(Policy.CACHE, URLS, healthy, engines, predicted, 100)[0] == "http://b"
    assert order_engines(Policy.COST, URLS, healthy, engines, predicted, 100)[0] == "http://c"
    idle = states()
    assert order_engines(Policy.COST, URLS, healthy, idle, predicted, 100)[0] == "http://b"
    healthy["http://b"] = False  # a sick engine comes last whatever it holds
    assert order_engines(Policy.CACHE, URLS, healthy, idle, predicted, 100)[-1] == "http://b"


def test_one_noisy_cost_measurement_does_not_undo_a_hit() -> None:
    engines = states()
    engines["http://b"].token_seconds = 20e-3  # measured on a bad second: 20x the others
    predicted = {"http://b": 90}  # b holds 90 of the 100 tokens (10 x 20e-3 > 100 x 1e-3)
    healthy = dict.fromkeys(URLS, True)
    assert order_engines(Policy.COST, URLS, healthy, engines, predicted, 100)[0] == "http://b"


def test_a_conversation_sticks_to_its_state_unless_that_engine_is_overloaded() -> None:
    """a holds 1,000 of 1,100 tokens. Busy fleet: moving to idle b costs b the 1,100 tokens
    and costs the requests after it RECOMPUTE_WEIGHT x the 1,000 recomputed, so a wins
    until its queue is more than 1 + RECOMPUTE_WEIGHT times the history ahead; an idle
    fleet is scored by time to first token."""
    healthy = dict.fromkeys(URLS, True)
    predicted = {"http://a": 1000}

    def first(queued_a: int, inflight: int) -> str:
        engines = states(a=queued_a, c=5000)
        for e in engines.values():
            e.num_inflight = inflight
        return order_engines(Policy.COST, URLS, healthy, engines, predicted, 1100)[0]

    assert RECOMPUTE_WEIGHT == 3.0
    assert first(1500, inflight=1) == "http://a"  # was b: 1,100 < 1,600 before
    assert first(3900, inflight=1) == "http://a"  # 4,000 < 1,100 + 3 x 1,000
    assert first(4100, inflight=1) == "http://b"  # overloaded: 4,200 > 1,100 + 3 x 1,000
    assert first(1500, inflight=0) == "http://b"  # an idle fleet: the first token sooner


def test_ties_go_to_the_least_loaded_then_the_turn() -> None:
    engines = states()
    engines["http://a"].num_inflight = 2
    order = order_engines(Policy.COST, URLS, dict.fromkeys(URLS, True), engines, {}, 100)
    assert order == ["http://b", "http://c", "http://a"]


def usage(cached: int) -> bytes:
    return json.dumps({"usage": {"prompt_tokens_details": {"cached_tokens": cached}}}).encode()


def test_a_decision_books_work_and_scores_its_prediction() -> None:
    engines = states()
    engine = engines["http://a"]
    engine.info = parse_engine_info(
        describe_engine(None, make_layout("full"), "sha256", True), "http://a"
    )
    engine.subscriber = EventSubscriber(engine.index, "ipc:///x")
    decision = Decision(URLS, Reason.CACHE_HIT, 100, {"http://a": 64}, engines)
    decision.dispatched("http://a")
    assert engine.num_inflight == 1 and engine.queued_tokens == 36
    decision.saw(b'data: {"choices": [{"text": "x"}]}\n\n')  # the first token: prefill done
    assert engine.num_inflight == 1 and engine.queued_tokens == 0
    decision.saw(b'data: {"choices": []}\n\ndata: ' + usage(48) + b"\n\n")
    decision.release()
    decision.release()  # twice is once
    assert engine.num_inflight == 0 and engine.queued_tokens == 0
    stats = engine.predictions
    assert (stats.num_observed, stats.num_over, stats.predicted_tokens, stats.actual_tokens) == (
        1,
        1,
        64,
        48,
    )


def test_a_prompt_in_flight_is_expected_where_it_went_until_answered() -> None:
    engines = states()
    engine = engines["http://a"]
    engine.info = parse_engine_info(
        describe_engine(None, make_layout("full"), "sha256", True), "http://a"
    )
    hashes = [bytes([i]) * 32 for i in range(3)]
    first = Decision(URLS, Reason.LOAD, 60, {}, engines, hashes={"http://a": hashes})
    first.dispatched("http://a")
    b = engine.info.block_size
    assert engine.pending_hit_tokens(hashes, 60) == min(3, 59 // b) * b
    assert engine.pending_hit_tokens([b"x" * 32, *hashes[1:]], 60) == 0  # another block 0
    first.release()
    assert engine.pending == {} and engine.pending_hit_tokens(hashes, 60) == 0


@pytest.mark.parametrize("data", [b'{"usage": {"prompt_tokens_details": {"cached_tokens": -1}}}',
                                  b'{"usage": "x"}', b'data: {"usage": [1]', b'"usage"'])  # fmt: skip
def test_a_bad_usage_is_no_observation(data: bytes) -> None:
    decision = Decision(URLS, Reason.LOAD, 10, {}, states())
    decision.saw(data)
    assert decision._actual is None


def good_info() -> dict[str, Any]:
    config = KVEventsConfig(True, "zmq", "tcp://*:5557", topic="t")
    return describe_engine(config, make_layout("granite"), "xxh3_128", True)


def test_an_info_answer_is_parsed_and_a_wildcard_is_the_engines_host() -> None:
    info = parse_engine_info(good_info(), "http://10.1.2.3:8000")
    assert info.endpoint == "tcp://10.1.2.3:5557" and info.topic == "t"
    assert {g.kind for g in info.groups} == {"mamba", "full_attention"}


@pytest.mark.parametrize(
    "change",
    [
        {"block_size": 0},
        {"block_size": True},
        {"block_size": 1 << 40},
        {"hash_algo": "md5"},
        {"groups": []},
        {"groups": [{"kind": "evil"}]},
        {"groups": [{"kind": "sliding_window", "sliding_window": -4}]},
        {"kv_events": {"enabled": True, "endpoint": "http://x:1"}},
        {"kv_events": {"enabled": True, "endpoint": "tcp://x:99999"}},
        {"kv_events": {"enabled": True, "endpoint": "tcp://x:1", "topic": 5}},
        {"kv_events": "on"},
    ],
)
def test_a_bad_info_answer_is_refused(change: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="kv_events info|hash_algo"):
        parse_engine_info({**good_info(), **change}, "http://e:1")


def test_the_routing_flags_are_checked() -> None:
    from hybridkv.cli import build_parser
    from hybridkv.proxy.command import routing_options
    from hybridkv.proxy.routing.options import RoutingOptions
    from hybridkv.proxy.routing.service import KVRouting

    parser = build_parser()
    args = parser.parse_args(["proxy", "--decode", "http://h1:1", "http://h2:2",
                              "--events", "tcp://*:5557", "auto", "--routing", "cache"])  # fmt: skip
    options = routing_options(args)
    assert options.policy is Policy.CACHE and options.events == ("tcp://*:5557", "auto")
    kv = KVRouting(["http://h1:1", "http://h2:2"], options)
    assert kv.engines["http://h1:1"].events_url == "tcp://h1:5557"  # the engine's host
    assert kv.engines["http://h2:2"].events_url is None  # found by its /kv_events
    one = parser.parse_args(["proxy", "--decode", "http://h1:1", "http://h2:2", "--events", "auto"])
    with pytest.raises(ValueError, match="one per engine"):
        routing_options(one)
    for bad in ({"events": ("http://x",)}, {"index_max_blocks": 0}, {"prefill_skip_tokens": -1},
                {"tokenize_timeout_seconds": float("nan")}):  # fmt: skip
        with pytest.raises(ValueError):
            RoutingOptions(**bad)  # type: ignore[arg-type]


def test_the_prefill_cost_is_read_from_an_engines_metrics_page() -> None:
    from hybridkv.proxy.routing.costs import read_totals

    page = "\n".join([
        "# HELP vllm:prompt_tokens_total prompt tokens",
        'vllm:prompt_tokens_total{model_name="m"} 1000.0',
        'hybridkv:cached_prompt_tokens_total{model_name="m",source="local"} 300.0',
        'hybridkv:cached_prompt_tokens_total{model_name="m",source="connector"} 100.0',
        'vllm:request_prefill_time_seconds_sum{model_name="m"} 1.5',
        'vllm:request_prefill_time_seconds_sum{model_name="m"} nan',  # skipped
        'vllm:prompt_tokens_total{model_name="x"} -5',  # skipped
        "garbage line",
    ])  # fmt: skip
    totals = {"seconds": 1.5, "prompt": 1000.0, "cached": 400.0}
    assert read_totals(page) == {"step_seconds": 0.0, "step_tokens": 0.0, **totals}

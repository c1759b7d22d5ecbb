"""Settle: a decision waits for an index that lags what its engine's answers say was
published, stops as soon as it caught up or at its cap; a forged seq is rejected and counted,
never waited on; reservations hold a routed prompt's blocks until its prefill is done."""

from __future__ import annotations

import asyncio
import json
import time

import msgspec

from hybridkv.kv_events.info import describe_engine
from hybridkv.kv_events.schema import BlockStored, KVEventBatch
from hybridkv.proxy.routing.decision import Decision, Reason
from hybridkv.proxy.routing.engine_info import parse_engine_info
from hybridkv.proxy.routing.engines import EngineState
from hybridkv.proxy.routing.index import EngineIndex
from hybridkv.proxy.routing.settle import (
    FORGED_MARGIN,
    MAX_SETTLE_SECONDS,
    SettleStats,
    note_answer,
    settle,
    settle_budget,
)
from hybridkv.proxy.routing.subscriber import EventSubscriber
from tests.kv.builders import make_layout

ENCODER = msgspec.msgpack.Encoder()
URLS = ["http://a", "http://b"]


def engine(url: str = "http://a") -> EngineState:
    state = EngineState(url, EngineIndex(100))
    state.info = parse_engine_info(describe_engine(None, make_layout("full"), "sha256", True), url)
    state.subscriber = EventSubscriber(state.index, "ipc:///nowhere", "kv")
    return state


async def deliver(state: EngineState, seq: int) -> None:
    stored = BlockStored([bytes([seq]) * 32], None, [], 16, None, "GPU", None, group_idx=0)
    frames = [b"kv", seq.to_bytes(8, "big"), ENCODER.encode(KVEventBatch(time.time(), [stored]))]
    assert state.subscriber is not None
    await state.subscriber.receive(frames)


def usage(cached: int, seq: object) -> bytes:
    body = {"usage": {"prompt_tokens_details": {"cached_tokens": cached}, "kv_events_seq": seq}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def test_a_decision_waits_for_the_events_an_answer_named_and_stops_once_they_came() -> None:
    async def scenario() -> tuple[bool, float, SettleStats]:
        a, stats = engine(), SettleStats()
        await deliver(a, 0)
        assert note_answer(a, 2, stats)  # the engine published 1 and 2: not received yet

        async def late_events() -> None:
            await asyncio.sleep(0.05)
            await deliver(a, 1)
            await deliver(a, 2)

        task = asyncio.create_task(late_events())
        start = time.monotonic()
        caught_up = await settle([a], 10_000, 2.0, stats)
        waited = time.monotonic() - start
        await task
        return caught_up, waited, stats

    caught_up, waited, stats = asyncio.run(scenario())
    assert caught_up and 0.04 <= waited < 1.9  # it did wait, and stopped long before its cap
    assert (stats.num_waits, stats.num_caught_up, stats.num_forged) == (1, 1, 0)


def test_the_wait_is_capped_by_the_flag_and_by_the_prefill_it_could_save() -> None:
    a = engine()
    a.token_seconds = 1e-3
    assert settle_budget([a], 100, 2.0) == 0.1  # 100 tokens at 1 ms: waiting longer costs more
    assert settle_budget([a], 100_000, 0.25) == 0.25  # the flag
    assert settle_budget([a], 100_000, 60.0) == MAX_SETTLE_SECONDS

    async def scenario() -> tuple[bool, float, SettleStats]:
        stats = SettleStats()
        await deliver(a, 0)
        assert note_answer(a, 5, stats)  # those batches never come
        start = time.monotonic()
        caught_up = await settle([a], 50, 2.0, stats)  # 50 ms of prefill to save
        return caught_up, time.monotonic() - start, stats

    caught_up, waited, stats = asyncio.run(scenario())
    assert not caught_up and 0.05 <= waited < 1.0
    assert (stats.num_waits, stats.num_caught_up) == (1, 0)


def test_a_forged_seq_is_rejected_counted_and_never_waited_on() -> None:
    async def scenario() -> tuple[float, SettleStats, EngineState]:
        a, stats = engine(), SettleStats()
        await deliver(a, 0)
        decision = Decision(URLS, Reason.LOAD, 100, {}, {"http://a": a}, settle=stats)
        decision.dispatched("http://a")
        decision.saw(usage(0, FORGED_MARGIN + 1))  # no engine is that far ahead of its stream
        decision.release()
        for bad in (-1, 10**30):
            note_answer(a, bad, stats)
        start = time.monotonic()
        assert await settle([a], 100_000, 2.0, stats)
        return time.monotonic() - start, stats, a

    waited, stats, a = asyncio.run(scenario())
    assert waited < 0.5 and stats.num_forged == 3 and stats.num_waits == 0
    assert a.answered_seq == -1


def test_an_answer_seq_is_read_from_the_stream_and_forgotten_after_a_restart() -> None:
    async def scenario() -> tuple[EngineState, SettleStats, bool]:
        a, stats = engine(), SettleStats()
        for seq in range(3):
            await deliver(a, seq)
        decision = Decision(URLS, Reason.LOAD, 100, {}, {"http://a": a}, settle=stats)
        decision.dispatched("http://a")
        decision.saw(usage(0, "7"))  # not a number: ignored
        assert a.answered_seq == -1
        decision.saw(usage(0, 9))
        assert a.answered_seq == 9
        await deliver(a, 0)  # the engine restarted: its sequence went back
        start = time.monotonic()
        done = await settle([a], 100_000, 2.0, stats)
        assert time.monotonic() - start < 0.5
        return a, stats, done

    a, stats, done = asyncio.run(scenario())
    assert done and stats.num_waits == 0 and a.answered_seq == 9  # of the earlier life


def test_a_reservation_holds_the_prompt_until_its_prefill_and_moves_with_the_request() -> None:
    a, b = engine("http://a"), engine("http://b")
    engines = {"http://a": a, "http://b": b}
    hashes = [bytes([i]) * 32 for i in range(3)]
    assert a.info is not None
    held = 3 * a.info.block_size  # the three blocks of a prompt one token longer
    decision = Decision(URLS, Reason.LOAD, 64, {}, engines, hashes=dict.fromkeys(URLS, hashes))
    decision.reserve()  # decided for a, not sent yet: a request decided now meets it there
    assert a.pending_hit_tokens(hashes, held + 1) == held and b.pending == {}
    decision.dispatched("http://b")  # a did not answer: it went to b
    assert a.pending == {} and b.pending_hit_tokens(hashes, held + 1) == held
    decision.saw(b'data: {"choices": [{"text": "x"}]}\n\n')  # its first token: prefilled
    assert b.pending == {}
    other = Decision(URLS, Reason.LOAD, 64, {}, engines, hashes=dict.fromkeys(URLS, hashes))
    other.reserve()
    other.unreserve()  # refused or cancelled before any engine answered
    other.unreserve()
    assert a.pending == {} and b.pending == {}


def test_answered_decisions_are_logged_and_the_settle_counters_exported() -> None:
    from collections import deque

    from hybridkv.proxy.routing.metrics import routing_families
    from hybridkv.proxy.routing.options import RoutingOptions
    from hybridkv.proxy.routing.service import KVRouting

    kv = KVRouting(URLS, RoutingOptions())
    a = kv.engines["http://a"]
    a.info, a.subscriber = engine().info, EventSubscriber(a.index, "ipc:///nowhere", "kv")
    log: deque[dict[str, object]] = deque(maxlen=4)
    decision = Decision(URLS, Reason.CACHE_HIT, 100, {"http://a": 32}, kv.engines, log=log)
    decision.expected = {"http://a": 64}
    decision.settle = kv.settle_stats
    decision.dispatched("http://a")
    decision.saw(usage(64, FORGED_MARGIN + 5))
    decision.release()
    assert list(log) == [{
        "engine": "http://a", "reason": "cache_hit", "result": "under", "num_prompt_tokens": 100,
        "predicted_cached_tokens": 32, "expected_cached_tokens": 64, "actual_cached_tokens": 64,
        "expected_by_engine": {"http://a": 64}, "queued_by_engine": {},
        "chosen": True, "settled": True, "id": 0, "source": None, "prefill_wait": "",
        "prefill_wait_seconds": 0.0,
    }]  # fmt: skip
    values = {
        m.name: [s.value for s in m.samples if s.name.endswith("_total")]
        for m in routing_families(kv)
    }
    assert values["hybridkv_proxy_settle_forged_seqs"] == [1]
    assert values["hybridkv_proxy_settle_waits"] == [0]


def test_a_first_chunk_seq_is_noted_and_a_landing_prefill_is_waited_for() -> None:
    from hybridkv.proxy.routing.settle import await_prefill

    async def scenario() -> tuple[EngineState, SettleStats, float]:
        a, stats = engine(), SettleStats()
        await deliver(a, 0)
        hashes = [bytes([i]) * 32 for i in range(3)]
        assert a.info is not None
        n = 3 * a.info.block_size + 1
        first = Decision(URLS, Reason.LOAD, n, {}, {"http://a": a}, hashes={"http://a": hashes})
        first.settle = stats
        first.dispatched("http://a")  # computing the prefix now

        async def lands() -> None:
            await asyncio.sleep(0.05)
            first.saw(b'data: {"choices": [{"text": "x"}], "kv_events_seq": 1}\n\n')
            assert a.answered_seq == 1 and a.pending == {}
            await asyncio.sleep(0.05)
            await deliver(a, 1)  # its events reach the index after its first chunk

        a.token_seconds = 1.0  # recomputing the prefix would take long: worth waiting
        task = asyncio.create_task(lands())
        start = time.monotonic()
        await await_prefill(a, hashes, n, stats, 60.0)
        waited = time.monotonic() - start
        await task
        return a, stats, waited

    a, stats, waited = asyncio.run(scenario())
    assert 0.09 <= waited < 1.9 and stats.num_prefill_waits == 1
    assert a.subscriber is not None and a.subscriber.stats.last_seq == 1

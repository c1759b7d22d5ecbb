"""The prefill wait (``settle.await_prefill``): a decision whose prefix the chosen engine is
computing for another request waits until that prefill landed -- however cheap recomputing
would look (the engine would hold the request behind it anyway) -- and stops at its bound
(the first-byte timeout) when the source never answers, counted. With ``--prefill-wait auto``
an attention-only engine's request is sent at once with the landed hit predicted; a hybrid's
still waits."""

from __future__ import annotations

import asyncio
import time

from hybridkv.proxy.routing.decision import Decision, Reason
from hybridkv.proxy.routing.engines import EngineState
from hybridkv.proxy.routing.metrics import _settle_families
from hybridkv.proxy.routing.settle import SettleStats, await_prefill
from tests.proxy.test_routing_settle import URLS, deliver, engine

HASHES = [bytes([i]) * 32 for i in range(3)]


def _computing(a: EngineState, stats: SettleStats) -> tuple[Decision, int]:
    assert a.info is not None
    n = 3 * a.info.block_size + 1
    first = Decision(URLS, Reason.LOAD, n, {}, {a.url: a}, hashes={a.url: HASHES})
    first.settle = stats
    first.dispatched(a.url)  # the engine computes the prefix for it now
    return first, n


def test_the_wait_lasts_until_the_prefill_landed_however_cheap_recomputing_looks() -> None:
    async def scenario() -> tuple[float, SettleStats, EngineState]:
        a, stats = engine(), SettleStats()
        await deliver(a, 0)
        first, n = _computing(a, stats)
        a.token_seconds = 1e-6  # recomputing the prefix would look nearly free

        async def lands() -> None:
            await asyncio.sleep(0.3)
            first.saw(b'data: {"choices": [{"text": "x"}], "kv_events_seq": 1}\n\n')
            await asyncio.sleep(0.05)
            await deliver(a, 1)

        task = asyncio.create_task(lands())
        start = time.monotonic()
        assert await await_prefill(a, HASHES, n, stats, 60.0)
        waited = time.monotonic() - start
        await task
        return waited, stats, a

    waited, stats, a = asyncio.run(scenario())
    assert waited >= 0.34 and stats.num_prefill_waits == 1
    assert stats.num_prefill_wait_timeouts == 0
    assert a.subscriber is not None and a.subscriber.stats.last_seq == 1  # landed, indexed


def test_a_source_that_never_answers_ends_the_wait_at_its_cap() -> None:
    async def scenario() -> SettleStats:
        a, stats = engine(), SettleStats()
        await deliver(a, 0)
        _, n = _computing(a, stats)
        assert not await await_prefill(a, HASHES, n, stats, 0.1)
        return stats

    stats = asyncio.run(scenario())
    assert stats.num_prefill_waits == 1 and stats.num_prefill_wait_timeouts == 1
    assert stats.prefill_wait_seconds >= 0.1


def test_the_timeouts_are_a_metric() -> None:
    class Routing:  # the one attribute _settle_families reads
        settle_stats = SettleStats(num_prefill_wait_timeouts=3)

    values = {
        m.name: [s.value for s in m.samples if s.name.endswith("_total")]
        for m in _settle_families(Routing())  # type: ignore[arg-type]
    }
    assert values["hybridkv_proxy_settle_prefill_wait_timeouts"] == [3]

"""``--prefill-wait``: a decision whose prefix the chosen engine computes for another request.
On an attention-only engine (``auto``) it is sent at once with the hit that prefill leaves
(the engine's in-flight prefix rule holds it until then); a hybrid's, or any with
``landed``, waits until the prefill landed, at most the first-byte timeout. The log names the
decision it followed."""

from __future__ import annotations

import asyncio
import json
from collections import deque

import pytest

from hybridkv.kv_events.info import describe_engine
from hybridkv.proxy.routing.decision import Decision, Reason
from hybridkv.proxy.routing.engine_info import parse_engine_info
from hybridkv.proxy.routing.options import RoutingOptions
from hybridkv.proxy.routing.service import KVRouting
from hybridkv.proxy.routing.subscriber import EventSubscriber
from tests.kv.builders import make_layout
from tests.proxy.test_routing_settle import deliver

URL = "http://a"


def _routing(layout: str, wait: str = "auto", max_seconds: float = 0.1) -> KVRouting:
    options = RoutingOptions(prefill_wait=wait, prefill_wait_max_seconds=max_seconds)
    kv = KVRouting([URL], options)
    state = kv.engines[URL]
    raw = describe_engine(None, make_layout(layout), "sha256", True)
    state.info = parse_engine_info(raw, URL)
    state.subscriber = EventSubscriber(state.index, "ipc:///nowhere", "kv")
    return kv


def _decide(kv: KVRouting, token_ids: tuple[int, ...]) -> Decision:
    """A decision for ``token_ids`` on the one engine, predicted (no wait yet)."""
    kv.num_decisions += 1
    d = Decision([URL], Reason.LOAD, len(token_ids), {}, kv.engines, number=kv.num_decisions)
    d.settle, d.log = kv.settle_stats, deque()
    kv._predict(d, token_ids, None)
    return d


async def _second_after_first(kv: KVRouting, source_len: int, n: int) -> Decision:
    """A first request computing ``source_len`` tokens on the engine, then a second (``n``
    tokens, the same ids) decided while it computes."""
    await deliver(kv.engines[URL], 0)
    first = _decide(kv, tuple(range(source_len)))
    first.reserve()
    first.dispatched(URL)
    second = _decide(kv, tuple(range(n)))
    await asyncio.wait_for(kv._await_prefill(second, tuple(range(n)), None), 2.0)
    return second


@pytest.mark.parametrize("layout", ["full", "gptoss"])  # gptoss: sliding windows too
def test_attention_only_is_sent_at_once_with_the_hit_the_prefill_leaves(layout: str) -> None:
    kv = _routing(layout)
    assert kv.engines[URL].info is not None
    b = kv.engines[URL].info.block_size
    second = asyncio.run(_second_after_first(kv, 3 * b + 1, 4 * b + 1))
    assert second.predicted[URL] == 3 * b  # the three blocks the first computes
    assert second.prefill_wait == "dispatched" and second.source == 1
    stats = kv.settle_stats
    assert stats.num_prefill_dispatched == 1 and stats.num_prefill_waits == 0


def test_a_source_ending_on_a_block_boundary_leaves_its_last_block_too() -> None:
    kv = _routing("full")
    assert kv.engines[URL].info is not None
    b = kv.engines[URL].info.block_size
    second = asyncio.run(_second_after_first(kv, 3 * b, 4 * b + 1))
    assert second.predicted[URL] == 3 * b  # its prefill caches all three full blocks


def test_a_hybrid_waits_until_landed_and_the_bound_is_the_first_byte_timeout() -> None:
    kv = _routing("granite", max_seconds=0.1)
    assert kv.engines[URL].info is not None
    b = kv.engines[URL].info.block_size
    second = asyncio.run(_second_after_first(kv, 3 * b + 1, 4 * b + 1))
    assert second.prefill_wait == "timeout" and 0.1 <= second.prefill_wait_seconds < 2.0
    assert second.predicted[URL] == 0  # nothing landed: the index's word
    stats = kv.settle_stats
    assert stats.num_prefill_waits == 1 and stats.num_prefill_wait_timeouts == 1


def test_landed_waits_on_attention_only_too() -> None:
    kv = _routing("full", wait="landed")
    assert kv.engines[URL].info is not None
    b = kv.engines[URL].info.block_size
    second = asyncio.run(_second_after_first(kv, 3 * b + 1, 4 * b + 1))
    assert second.prefill_wait == "timeout" and kv.settle_stats.num_prefill_dispatched == 0


def test_the_log_names_the_source_and_the_wait() -> None:
    kv = _routing("full")
    assert kv.engines[URL].info is not None
    b = kv.engines[URL].info.block_size
    second = asyncio.run(_second_after_first(kv, 3 * b + 1, 4 * b + 1))
    second.dispatched(URL)
    usage = {"usage": {"prompt_tokens_details": {"cached_tokens": 3 * b}}}
    second.saw(b"data: " + json.dumps(usage).encode() + b"\n\n")
    second.release()
    assert second.log is not None
    (record,) = second.log
    assert record["id"] == 2 and record["source"] == 1
    assert record["prefill_wait"] == "dispatched" and record["predicted_cached_tokens"] == 3 * b


def test_the_prefill_wait_flag_is_checked() -> None:
    try:
        RoutingOptions(prefill_wait="sometimes")
    except ValueError as exc:
        assert "--prefill-wait" in str(exc)
    else:
        raise AssertionError("an unknown --prefill-wait was accepted")

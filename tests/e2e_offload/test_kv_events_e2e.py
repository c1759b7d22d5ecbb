"""Acceptance: a subscriber decoding our ZMQ stream with vLLM's schema rebuilds exactly the
engine's own view -- the device prefix map per group and each tier's units -- after a mixed
workload that evicts from the device pool and the CPU tier, and across prefix-cache resets
(device only, then with the tiers). Outputs equal a run that caches nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq

from hybridkv.connectors.offloading.tier_registry import tier_medium
from hybridkv.kv_events.schema import MEDIUM_DEVICE
from tests.kv_events.vllm_schema import CacheIndex, Entry

from .helpers import LLM, assert_clean, generate, ids, make_llm, offload, reference, sched

pytestmark = pytest.mark.slow

PREFIXES = [ids(96, 200 + k) for k in range(3)]
PROMPTS = [PREFIXES[i % 3] + ids(20 + 7 * i, 300 + i) for i in range(9)]


def engine_view(llm: LLM) -> set[Entry]:
    kv = llm.engine.kv
    view: set[Entry] = {(g, MEDIUM_DEVICE, h) for h, g in kv.pool.cached}
    for sm in kv.state:
        view |= {(g, MEDIUM_DEVICE, h) for h, g in sm.pool.cached}
    for tier in sched(llm).stack:
        view |= {(None, tier.name.value.upper(), e.unit_hash) for e in tier.index.ready_entries()}
    return view


class Subscriber:
    """A SUB socket (bound: the engine's PUB connects, as with ``tcp://127.0.0.1:5557``) and a
    replay client, both speaking vLLM's framing."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
        self.port = self.sub.bind_to_random_port("tcp://127.0.0.1")
        self.live: dict[int, bytes] = {}

    def drain(self, quiet: float = 0.3) -> None:
        while self.sub.poll(int(quiet * 1000)):
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == b"kv-events"
            self.live[int.from_bytes(seq, "big")] = payload

    def replay(
        self, ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, start: int
    ) -> dict[int, bytes]:
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(endpoint)
        dealer.send_multipart((b"", start.to_bytes(8, "big")))
        out: dict[int, bytes] = {}
        while True:
            assert dealer.poll(5000), "no replay answer"
            _, topic, seq, payload = dealer.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                break
            assert topic == b"kv-events"
            out[int.from_bytes(seq, "big")] = payload
        dealer.close(linger=0)
        return out


def test_a_vllm_subscriber_rebuilds_the_engine_view(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    model = checkpoints["granitemoehybrid"]
    want = reference(model, PROMPTS)
    ctx = zmq.Context.instance()
    sub = Subscriber(ctx)
    replay_endpoint = f"ipc://{tmp_path}/replay.sock"
    events_config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{sub.port}",
        "replay_endpoint": replay_endpoint,
        "topic": "kv-events",
    }
    llm = make_llm(model, offload(cpu="240KiB"), kv_cache_memory="400KiB", max_model_len=256,
                   max_num_seqs=4, num_state_slots=8, kv_events_config=events_config)  # fmt: skip
    time.sleep(0.3)  # the PUB connects and the subscription reaches it
    publisher = llm.engine.kv_events
    assert publisher is not None
    index = CacheIndex()

    def check() -> None:
        """Catch up as a vLLM subscriber does: live batches, gaps filled by replay."""
        assert publisher.flush(5.0)  # tier events of late saves too
        sub.drain()
        missed = sub.replay(ctx, replay_endpoint, index.num_batches)
        for seq, payload in missed.items():
            assert sub.live.get(seq, payload) == payload
        for seq in sorted(missed):
            assert seq == index.num_batches
            index.apply(missed[seq])
        assert index.entries == engine_view(llm)

    outs = generate(llm, PROMPTS[:5])
    check()
    assert any(medium == tier_medium("cpu") for _, medium, _ in index.entries)
    assert index.num_removed.get(MEDIUM_DEVICE, 0) > 0, "the device pool should evict"
    assert llm.reset_prefix_cache()  # device only: the tiers are announced again
    check()
    outs += generate(llm, PROMPTS[5:])  # loads from the CPU tier, evicts again
    check()
    assert index.num_removed.get(tier_medium("cpu"), 0) > 0, "the CPU tier should evict"
    assert llm.reset_prefix_cache(tiers=True)
    check()
    assert not index.entries - {e for e in index.entries if e[1] != MEDIUM_DEVICE}
    assert [o.token_ids for o in outs] == want
    stats = llm.engine.stats()
    assert stats.kv_events is not None and stats.kv_events.dropped_batches == 0
    assert_clean(llm)

    # the live stream (once the subscription reached the PUB) had no gap
    live = sub.live
    assert live, "nothing arrived on the PUB socket"
    assert sorted(live) == list(range(min(live), index.num_batches))
    llm.engine.shutdown()

"""The collector's batches, decoded with vLLM's schema: one ``BlockStored`` per run of a
request's new blocks in one group (parent hash, tokens, spec kind, window), removals merged,
tier units without a group, and nothing published for a step without changes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from hybridkv.connectors.config import TierName
from hybridkv.connectors.tier_events import TierEvent
from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator
from hybridkv.kv.hashing import BlockHash
from hybridkv.kv_events.collector import KVEventCollector
from hybridkv.kv_events.config import KVEventsConfig
from hybridkv.kv_events.publisher import ZmqEventPublisher
from hybridkv.kv_events.schema import KVEventBatch
from hybridkv.kv_events.stats import PublisherStats
from tests.kv.builders import B, FakeRequest, make_layout, run_step
from tests.kv_events.vllm_schema import DECODER, BlockRemoved, BlockStored
from tests.kv_events.vllm_schema import KVEventBatch as WireBatch
from tests.support.waits import wait_for

ENCODER = msgspec.msgpack.Encoder()


class Capture:
    def __init__(self) -> None:
        self.batches: list[WireBatch] = []

    def publish(self, batch: KVEventBatch) -> None:
        self.batches.append(DECODER.decode(ENCODER.encode(batch)))  # through the wire

    @property
    def last_seq(self) -> int:
        return len(self.batches) - 1

    def set_poll_hook(self, hook: object) -> None:
        return None

    def stats(self) -> PublisherStats:
        return PublisherStats(len(self.batches))

    def flush(self, timeout: float) -> bool:
        return True

    def shutdown(self) -> None:
        return None


@dataclass
class TokenRequest(FakeRequest):
    @property
    def all_token_ids(self) -> list[int]:
        return self.token_ids

    @property
    def salted(self) -> bool:
        return self.cache_salt is not None


def setup(name: str) -> tuple[KVCacheCoordinator, KVEventCollector, Capture]:
    layout = make_layout(name)
    coord = KVCacheCoordinator(layout, KVCacheConfig(64, 8, True, 2 * B, key_events=True))
    capture = Capture()
    return coord, KVEventCollector(layout, capture), capture


def prefill(coord: KVCacheCoordinator, req: FakeRequest) -> None:
    hit = coord.find_cache_hit(req)
    assert run_step(coord, req, req.num_tokens - hit.num_tokens, hit)


def test_a_prefill_is_one_stored_run_per_group_with_tokens_and_parents() -> None:
    coord, collector, capture = setup("gemma3")  # 1 full + sliding groups (window 8)
    tokens = list(range(100, 100 + 4 * B + 1))
    prefill(coord, TokenRequest("a", tokens))
    collector.publish_step(coord.take_events())
    (batch,) = capture.batches
    assert batch.data_parallel_rank == 0 and batch.ts > 0
    by_group = {ev.group_idx: ev for ev in batch.events}
    assert all(isinstance(ev, BlockStored) for ev in batch.events)
    assert len(by_group) == len(batch.events) == len(coord.layout.groups)
    hashes = TokenRequest("x", tokens).block_hashes
    for g, ev in by_group.items():
        assert isinstance(ev, BlockStored) and g is not None
        spec = coord.layout.groups[g].spec
        window = getattr(spec, "sliding_window", None)
        kind = "sliding_window" if window else "full_attention"
        assert (ev.medium, ev.block_size, ev.kv_cache_spec_kind) == ("GPU", B, kind)
        assert ev.kv_cache_spec_sliding_window == window
        assert ev.block_hashes == hashes[: len(ev.block_hashes)] and ev.parent_block_hash is None
        assert ev.token_ids == tokens[: B * len(ev.block_hashes)]
        assert (ev.lora_id, ev.lora_name, ev.extra_keys) == (None, None, None)
    collector.publish_step(coord.take_events())
    assert len(capture.batches) == 1  # nothing changed: nothing published


def test_a_sharer_stores_from_its_junction_and_state_groups_say_mamba() -> None:
    coord, collector, capture = setup("granite")
    shared = list(range(3 * B))
    a = TokenRequest("a", [*shared, 1, 2, 3])
    for _ in range(3):  # block by block: states saved at 2B (due) and 3B (trailing)
        assert run_step(coord, a, B)
    assert run_step(coord, a, 3)
    coord.free(a)
    collector.publish_step(coord.take_events())
    b = TokenRequest("b", [*shared, *range(500, 500 + 2 * B + 1)])
    prefill(coord, b)
    collector.publish_step(coord.take_events())
    full = coord.layout.attention_group_ids[0]
    stored = [ev for ev in capture.batches[-1].events if isinstance(ev, BlockStored)]
    (run,) = [ev for ev in stored if ev.group_idx == full]
    assert run.parent_block_hash == b.block_hashes[2]  # after the 3 shared blocks
    assert run.block_hashes == b.block_hashes[3:5]
    assert run.token_ids == b.token_ids[3 * B : 5 * B]
    state = [
        ev
        for ev in capture.batches[0].events
        if isinstance(ev, BlockStored) and ev.group_idx in coord.layout.state_group_ids
    ]
    assert {ev.kv_cache_spec_kind for ev in state} == {"mamba"}
    found = sorted(a.block_hashes.index(h) for ev in state for h in ev.block_hashes)
    assert found == sorted([1, 2] * len(coord.layout.state_group_ids))
    for ev in state:
        (h,) = ev.block_hashes
        k = a.block_hashes.index(h)
        assert ev.token_ids == a.token_ids[k * B : (k + 1) * B]
        assert ev.parent_block_hash == a.block_hashes[k - 1]


def test_tier_units_chain_into_one_event_and_carry_no_group() -> None:
    coord, collector, capture = setup("full")
    h = [BlockHash(bytes([i]) * 16) for i in range(4)]
    for i, tier in [(0, TierName.CPU), (1, TierName.CPU), (2, TierName.DISK)]:
        parent = h[i - 1] if i else None
        collector.on_tier_event(TierEvent(True, tier, h[i], 32 * (i + 1), parent, 32))
    collector.on_tier_event(TierEvent(False, TierName.CPU, h[1], 64, h[0], 32))
    collector.on_tier_event(TierEvent(False, TierName.CPU, h[0], 32, None, 32))
    collector.publish_step([])
    cpu, disk, removed = capture.batches[0].events
    assert isinstance(cpu, BlockStored) and isinstance(disk, BlockStored)
    assert (cpu.block_hashes, cpu.parent_block_hash, cpu.medium) == (h[:2], None, "CPU")
    assert (cpu.group_idx, cpu.token_ids, cpu.block_size) == (None, [], 32)
    assert (disk.block_hashes, disk.parent_block_hash, disk.medium) == ([h[2]], h[1], "DISK")
    assert isinstance(removed, BlockRemoved)
    assert (removed.block_hashes, removed.medium, removed.group_idx) == ([h[1], h[0]], "CPU", None)


def test_tier_events_go_out_while_the_engine_idles(tmp_path: Path) -> None:
    layout = make_layout("full")
    publisher = ZmqEventPublisher(KVEventsConfig(True, "zmq", f"ipc://{tmp_path}/t.sock"))
    collector = KVEventCollector(layout, publisher)
    publisher.set_poll_hook(collector.pump_tier_events)
    try:
        unit = BlockHash(b"\x01" * 16)
        collector.on_tier_event(TierEvent(True, TierName.CPU, unit, 32, None, 32))
        # no step, no flush: the publisher thread's own poll sends it
        wait_for(lambda: publisher.stats().published_batches, 5, what="the tier event's batch")
    finally:
        publisher.shutdown()

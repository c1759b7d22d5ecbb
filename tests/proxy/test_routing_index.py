"""The router's prediction is the engine's hit: a real coordinator's events (through the wire
encoding) feed an ``EngineIndex``, and for every probe ``predict_hit_tokens`` equals
``find_cache_hit`` -- full, sliding, Mamba and GDN layouts, under eviction -- including the
hybrid whose attention blocks are cached but whose state checkpoint is gone (a miss)."""

from __future__ import annotations

import random

import msgspec
import pytest

from hybridkv.connectors.tier_events import TierEvent
from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator
from hybridkv.kv_events.collector import KVEventCollector
from hybridkv.kv_events.info import describe_engine
from hybridkv.kv_events.schema import BlockRemoved, BlockStored, KVEventBatch
from hybridkv.kv_events.stats import PublisherStats
from hybridkv.proxy.routing.engine_info import EngineInfo, parse_engine_info
from hybridkv.proxy.routing.engines import block_hashes
from hybridkv.proxy.routing.index import EngineIndex
from hybridkv.proxy.routing.scoring import predict_hit_tokens
from tests.kv.builders import B, FakeRequest, make_layout, prefill

ENCODER = msgspec.msgpack.Encoder()
DECODER = msgspec.msgpack.Decoder(KVEventBatch)


class IndexFeed:
    """A publisher that applies every batch to an index, through the wire encoding."""

    def __init__(self, index: EngineIndex) -> None:
        self.index = index

    def publish(self, batch: KVEventBatch) -> None:
        self.index.apply(DECODER.decode(ENCODER.encode(batch)))

    def set_poll_hook(self, hook: object) -> None:
        return None

    def stats(self) -> PublisherStats:
        return PublisherStats()

    def flush(self, timeout: float) -> bool:
        return True

    def shutdown(self) -> None:
        return None


def engine(name: str, blocks_per_group: int = 24, slots: int = 6):
    layout = make_layout(name)
    num_blocks = blocks_per_group * len(layout.attention_group_ids)
    config = KVCacheConfig(num_blocks, slots, True, 2 * B, key_events=True)
    coord = KVCacheCoordinator(layout, config)
    index = EngineIndex(10_000)
    collector = KVEventCollector(layout, IndexFeed(index))
    info = parse_engine_info(describe_engine(None, layout, "sha256", True), "http://e:1")
    return coord, collector, index, info


def predict(index: EngineIndex, info: EngineInfo, tokens: list[int], salt: str | None = None):
    hashes = block_hashes(info, tuple(tokens), salt)
    return predict_hit_tokens(index, info.groups, hashes, len(tokens), info.block_size)


def serve(coord: KVCacheCoordinator, collector: KVEventCollector, req: FakeRequest) -> None:
    prefill(coord, req)
    coord.free(req)
    collector.publish_step(coord.take_events())


@pytest.mark.parametrize("name", ["full", "gemma3", "granite", "qwen35", "two_windows"])
def test_the_prediction_is_the_engines_hit_under_eviction(name: str) -> None:
    rng = random.Random(name)
    coord, collector, index, info = engine(name)
    prefixes = [
        [rng.randrange(1000) for _ in range(rng.choice([B, 3 * B, 5 * B]))] for _ in range(4)
    ]
    num_hits = 0
    for i in range(40):
        tokens = rng.choice(prefixes) + [
            rng.randrange(1000) for _ in range(rng.randrange(1, 3 * B))
        ]
        probe = FakeRequest(f"p{i}", tokens)
        expected = coord.find_cache_hit(probe).num_tokens
        assert predict(index, info, tokens) == expected, f"request {i}"
        num_hits += expected > 0
        serve(coord, collector, FakeRequest(f"r{i}", tokens))
    assert num_hits >= 5  # the workload shares prefixes: hits were checked, not only misses
    assert index.stats.num_batches > 0


def test_a_hybrid_with_its_checkpoint_evicted_is_predicted_a_miss() -> None:
    coord, collector, index, info = engine("granite", blocks_per_group=100, slots=4)
    first = list(range(4 * B + 2))
    serve(coord, collector, FakeRequest("a", first))
    again = [*first[: 4 * B], 7, 7, 7]
    assert (
        predict(index, info, again) == coord.find_cache_hit(FakeRequest("x", again)).num_tokens > 0
    )
    # "a"'s checkpoints go (the book evicts them: one-shot requests no longer flush them, the
    # policy is scan resistant), its attention blocks stay
    for sm in coord.state:
        while sm.book.evict_one():
            pass
    collector.publish_step(coord.take_events())
    full = coord.layout.attention_group_ids[0]
    hashes = block_hashes(info, tuple(again), None)
    assert all(index.holds("GPU", full, h) for h in hashes[:4])  # attention: all there
    assert coord.find_cache_hit(FakeRequest("y", again)).num_tokens == 0
    assert predict(index, info, again) == 0  # an attention-only index would say 4 blocks


def test_a_salt_keys_other_blocks() -> None:
    coord, collector, index, info = engine("full")
    tokens = list(range(3 * B + 1))
    serve(coord, collector, FakeRequest("a", tokens, cache_salt="tenant-a"))
    assert predict(index, info, tokens, "tenant-a") == 3 * B
    assert predict(index, info, tokens, "tenant-b") == 0
    assert predict(index, info, tokens) == 0


def test_a_reset_clears_every_group_and_keeps_the_tier_units_still_held() -> None:
    """``reset_prefix_cache``'s batch (``AllBlocksCleared``, then what the tiers hold): no
    device key is left in any group, state checkpoints included, and of two CPU units the
    one the tiers still hold stays (the engine dropped the other)."""
    coord, collector, index, info = engine("granite", blocks_per_group=100)
    tokens = list(range(4 * B + 2))
    serve(coord, collector, FakeRequest("a", tokens))
    hashes = block_hashes(info, tuple(tokens), None)
    units = [TierEvent(True, "cpu", h, (i + 1) * B, None, B) for i, h in enumerate(hashes[:2])]
    for unit in units:
        collector.on_tier_event(unit)
    collector.publish_step([])
    assert predict(index, info, tokens) == 4 * B and index.count("CPU") == 2
    assert coord.reset_prefix_cache()
    coord.take_events()  # the pools' CLEARED: said once by publish_reset (engine/cache_reset.py)
    collector.publish_reset(lambda: units[:1])
    assert index.media() == {"CPU"} and index.count("GPU") == 0
    assert index.holds("CPU", None, hashes[0]) and not index.holds("CPU", None, hashes[1])
    assert coord.find_cache_hit(FakeRequest("b", tokens)).num_tokens == 0 == index.count("GPU")


def test_the_index_is_bounded_and_counts_what_it_forgets() -> None:
    index = EngineIndex(3)
    stored = BlockStored([b"a", b"b"], None, [], B, None, "GPU", None, group_idx=0)
    index.apply(KVEventBatch(1.0, [stored]))
    index.apply(
        KVEventBatch(2.0, [BlockStored([b"c", b"d"], b"b", [], B, None, "GPU", None, group_idx=0)])
    )
    assert len(index) == 3 and index.stats.num_evictions == 1 and index.count("GPU") == 3
    assert not index.holds("GPU", 0, b"a") and index.holds("GPU", 0, b"d")
    index.apply(KVEventBatch(3.0, [BlockRemoved([b"zz"], "GPU", group_idx=0)]))
    assert index.stats.num_unknown_removals == 1
    unit = BlockStored([b"u"], None, [], 4 * B, None, "CPU", None)
    index.apply(KVEventBatch(4.0, [unit]))
    assert index.holds("CPU", None, b"u") and index.tier_media == {"CPU"}
    assert index.media() == {"GPU", "CPU"} and index.count("CPU") == 1
    index.apply(KVEventBatch(5.0, [BlockRemoved([b"u"], "CPU")]))
    assert index.media() == {"GPU"} and index.count("GPU") == 2 == len(index)


def test_engines_with_other_block_sizes_get_their_own_hashes() -> None:
    """Two engines, block sizes 4 and 8: one decision predicts each one's own hit."""
    import asyncio

    from hybridkv.proxy.routing.options import RoutingOptions
    from hybridkv.proxy.routing.service import KVRouting
    from hybridkv.proxy.routing.subscriber import EventSubscriber

    urls = ["http://small", "http://large"]
    kv = KVRouting(urls, RoutingOptions())
    coords = {}
    for url, size in zip(urls, (4, 8), strict=True):
        layout = make_layout("granite", block_size=size)
        coord = KVCacheCoordinator(layout, KVCacheConfig(64, 6, True, 2 * size, key_events=True))
        state = kv.engines[url]
        state.info = parse_engine_info(describe_engine(None, layout, "sha256", True), url)
        state.subscriber = EventSubscriber(state.index, "ipc:///x")
        collector = KVEventCollector(layout, IndexFeed(state.index))
        tokens = list(range(30))
        req = FakeRequest("a", tokens, block_size=size)
        serve(coord, collector, req)
        coords[url] = coord
    probe = [*range(30), 99]
    decision = asyncio.run(
        kv.decide(None, "/v1/completions", {"prompt": probe}, {}, urls, {})  # type: ignore[arg-type]
    )
    for url in urls:
        size = kv.engines[url].info.block_size  # type: ignore[union-attr]
        want = coords[url].find_cache_hit(FakeRequest("p", probe, block_size=size)).num_tokens
        assert decision.predicted[url] == want > 0
    assert decision.predicted["http://small"] != decision.predicted["http://large"]


def test_a_remote_unit_serves_every_engine_with_the_remote_tier() -> None:
    _, _, _, info = engine("full")
    tokens = list(range(4 * B + 1))
    hashes = block_hashes(info, tuple(tokens), None)
    writer, reader, cpu_only = EngineIndex(100), EngineIndex(100), EngineIndex(100)

    def unit(medium: str, h: bytes) -> KVEventBatch:
        return KVEventBatch(1.0, [BlockStored([h], None, [], 2 * B, None, medium, None)])

    writer.apply(unit("REMOTE", hashes[3]))  # a unit ending at block 3: 4 blocks
    reader.apply(unit("REMOTE", b"another unit"))  # the reader has the tier too
    cpu_only.apply(unit("CPU", b"its own unit"))
    peers = [writer, reader, cpu_only]

    def hit(index: EngineIndex) -> int:
        return predict_hit_tokens(index, info.groups, hashes, len(tokens), B, peers)

    assert hit(writer) == hit(reader) == 4 * B
    assert hit(cpu_only) == 0  # no remote tier: another engine's unit is not its
    cpu_only.apply(unit("CPU", hashes[1]))
    assert hit(cpu_only) == 2 * B  # its own CPU unit, never a peer's

"""What a router's index needs from the events: vLLM 0.32's ``extra_keys`` (the salt on block
0), the group and its kind, the medium, and hybridkv's one extension, ``state_checkpoint_ends``
-- every batch still decoded by a decoder written to vLLM 0.32's structs (vLLM's own classes
read them in ``test_vllm_decoder.py``)."""

from __future__ import annotations

import msgspec

from hybridkv.kv_events.collector import KVEventCollector
from hybridkv.kv_events.schema import BlockStored as OwnStored
from hybridkv.kv_events.schema import KVEventBatch
from tests.kv.builders import B, run_step
from tests.kv_events.test_collector import Capture, TokenRequest, prefill, setup
from tests.kv_events.vllm_schema import BlockStored

ENCODER = msgspec.msgpack.Encoder()
OWN_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def stored(capture: Capture) -> list[BlockStored]:
    return [ev for b in capture.batches for ev in b.events if isinstance(ev, BlockStored)]


def test_a_salted_requests_block_0_carries_the_salt_as_vllm_does() -> None:
    coord, collector, capture = setup("gemma3")
    salted = TokenRequest("s", list(range(500, 500 + 3 * B + 1)), cache_salt="tenant-1")
    prefill(coord, salted)
    prefill(coord, TokenRequest("p", list(range(900, 900 + 3 * B + 1))))
    collector.publish_step(coord.take_events())
    events = stored(capture)
    by_salt = [ev for ev in events if ev.block_hashes[0] == salted.block_hashes[0]]
    assert len(by_salt) == len(coord.layout.groups)  # one run per group
    for ev in by_salt:
        assert ev.extra_keys == [("tenant-1",), *[None] * (len(ev.block_hashes) - 1)]
        assert ev.token_ids == []  # the salt, never the tokens
    others = [ev for ev in events if ev not in by_salt]
    assert others and all(ev.extra_keys is None for ev in others)


def test_omit_token_ids_omits_the_salt_too() -> None:
    coord, _, capture = setup("full")
    collector = KVEventCollector(coord.layout, capture, omit_token_ids=True)
    prefill(coord, TokenRequest("s", list(range(3 * B + 1)), cache_salt="tenant-1"))
    collector.publish_step(coord.take_events())
    events = stored(capture)
    assert events and all(ev.extra_keys is None for ev in events)


def test_state_groups_say_where_their_checkpoints_end() -> None:
    coord, collector, capture = setup("granite")
    req = TokenRequest("a", list(range(3 * B + 3)))
    own: list[KVEventBatch] = []
    capture_publish = capture.publish

    def keep_both(batch: KVEventBatch) -> None:
        own.append(OWN_DECODER.decode(ENCODER.encode(batch)))
        capture_publish(batch)

    collector.publisher.publish = keep_both  # type: ignore[method-assign]
    for _ in range(3):  # block by block: checkpoints due at 2B, trailing at 3B
        assert run_step(coord, req, B)
    coord.free(req)
    collector.publish_step(coord.take_events())
    state_ids = set(coord.layout.state_group_ids)
    ends = {
        (ev.group_idx, h, end)
        for b in own
        for ev in b.events
        if isinstance(ev, OwnStored) and ev.group_idx in state_ids
        for h, end in zip(ev.block_hashes, ev.state_checkpoint_ends or [], strict=True)
    }
    assert ends  # every state key came with its length
    for _, h, end in ends:
        assert req.block_hashes.index(h) == end // B - 1
    attention = [ev for b in own for ev in b.events if isinstance(ev, OwnStored)]
    assert all(
        ev.state_checkpoint_ends is None for ev in attention if ev.group_idx not in state_ids
    )
    # vLLM's decoder read the same batches (Capture decodes with it) and dropped the field
    assert {ev.kv_cache_spec_kind for ev in stored(capture) if ev.group_idx in state_ids} == {
        "mamba"
    }

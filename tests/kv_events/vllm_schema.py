"""A subscriber's schema, written from vLLM 0.32's event classes (``vllm/distributed/kv_events.py``):
the struct options and field order a vLLM subscriber decodes with (batches ``array_like``,
events tagged maps, ``omit_defaults``; no field of hybridkv's extension). Kept apart from
``hybridkv.kv_events.schema`` on purpose: the tests decode our bytes with this one."""

from __future__ import annotations

from typing import Any

import msgspec


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[int] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)

Entry = tuple[int | None, str | None, bytes | int]  # (group_idx, medium, block hash)


class CacheIndex:
    """What a router keeps: the cached block hashes per group and medium."""

    def __init__(self) -> None:
        self.entries: set[Entry] = set()
        self.num_batches = 0
        self.num_removed: dict[str | None, int] = {}  # removed block hashes per medium

    def apply(self, payload: bytes) -> KVEventBatch:
        batch = DECODER.decode(payload)
        self.num_batches += 1
        for ev in batch.events:
            if isinstance(ev, AllBlocksCleared):
                self.entries.clear()
            elif isinstance(ev, BlockStored):
                self.entries.update((ev.group_idx, ev.medium, h) for h in ev.block_hashes)
            else:
                gone = {(ev.group_idx, ev.medium, h) for h in ev.block_hashes}
                assert gone <= self.entries, "removed a block never stored"
                self.entries -= gone
                self.num_removed[ev.medium] = self.num_removed.get(ev.medium, 0) + len(gone)
        return batch

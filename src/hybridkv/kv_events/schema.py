"""The wire schema: vLLM's KV event classes (``vllm/distributed/kv_events.py``), field for field.

Encoding (msgspec, as vLLM's)::

    KVEventBatch   a positional array  [ts, events, data_parallel_rank]       (array_like)
    each event     a map tagged by class name, fields at their default omitted
                   {"type": "BlockStored", "block_hashes": [...], ...}        (tag=True)

so a subscriber built on vLLM's classes decodes these bytes unchanged. Field order is vLLM's;
the fields hybridkv never sets (``lora_id``, ``lora_name``...) stay at their defaults (required
ones are sent as nil, as vLLM sends them). ``extra_keys`` is vLLM 0.32's: one entry per block,
``(cache_salt,)`` on a salted request's block 0, None elsewhere.

One extension, after vLLM's fields: ``state_checkpoint_ends`` on a state group's
``BlockStored``. Events are maps (not ``array_like``), and a msgspec struct skips keys it does
not know, so vLLM's decoder reads these events and drops the field; a new event *type* would
fail its tagged union, hence a field.
"""

from __future__ import annotations

from typing import Any

import msgspec

from hybridkv.kv.spec import SpecKind

# ``medium`` of an event: where the blocks are. The device pool is "GPU" as in vLLM (routers
# weight it highest), whatever the device; an offloading tier's is its ``TierEntry.medium``
# (``connectors/offloading/tier_registry.py``: "CPU", "DISK", "REMOTE" for the built-ins).
MEDIUM_DEVICE = "GPU"

# vLLM's spec kinds; its Mamba spec covers every recurrent state (Mamba2, Gated DeltaNet)
SPEC_KIND = {SpecKind.FULL: "full_attention", SpecKind.SLIDING: "sliding_window",
             SpecKind.STATE: "mamba"}  # fmt: skip
KIND_STATE = SPEC_KIND[SpecKind.STATE]

ExternalBlockHash = bytes | int  # vLLM's: hybridkv's hashes are bytes (32 or 16 long)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class of the KV cache events."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    # hybridkv's extension (state groups only): per hash, the prompt length of the checkpoint
    # it names ("the recurrent state after these many tokens can be restored"); a router may
    # resume a prefix from this group only at these lengths. None: not a state group, or the
    # lengths are unknown (the hashes still name checkpoints at their blocks' ends).
    state_checkpoint_ends: list[int] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared

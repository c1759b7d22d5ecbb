"""How much KV cache an engine gets: blocks and state slots from the memory budget, the
checkpoint budget in slots, and the model dtype ``auto`` resolves to."""

from __future__ import annotations

from dataclasses import dataclass

from hybridkv.config import EngineConfig
from hybridkv.kv.spec import KVCacheLayout


@dataclass(frozen=True, slots=True)
class CacheSizing:
    num_blocks: int
    num_state_slots: int
    max_checkpoints: int | None = None  # per state group: state_checkpoint_budget in slots
    checkpoint_room: int = 0  # of num_state_slots, added for checkpoints (``checkpoint_room``)


def checkpoint_capacity(budget: float, memory_bytes: int, layout: KVCacheLayout) -> int | None:
    """Checkpoints per state group that fit ``budget`` of the KV memory (a checkpoint at one
    boundary takes a slot in every state group); None without state groups."""
    slot_bytes = layout.total_state_slot_bytes()
    if slot_bytes == 0:
        return None
    return int(budget * memory_bytes) // slot_bytes


def size_cache(config: EngineConfig, layout: KVCacheLayout, max_model_len: int) -> CacheSizing:
    """Blocks and state slots from the memory budget; a clear error if it cannot hold one
    request of ``max_model_len`` tokens."""
    cache, sched = config.cache, config.scheduler
    slots = cache.num_state_slots or (3 * sched.max_num_seqs + 16 if layout.state_group_ids else 0)
    if layout.state_group_ids and slots < sched.max_num_seqs + 1:
        raise ValueError(f"num_state_slots={slots} must exceed max_num_seqs={sched.max_num_seqs}")
    num_blocks = layout.num_blocks_for(cache.kv_cache_memory, slots)
    need = 1
    if layout.attention_group_ids:
        need = -(-max_model_len // layout.block_size) * len(layout.attention_group_ids) + 1
        if num_blocks < need:
            raise ValueError(
                f"kv_cache_memory={cache.kv_cache_memory} bytes holds {num_blocks} blocks of "
                f"{layout.page_bytes} bytes, but one request of max_model_len={max_model_len} "
                f"tokens needs {need}: raise kv_cache_memory or lower max_model_len"
            )
    elif num_blocks < 1:
        raise ValueError(
            f"kv_cache_memory={cache.kv_cache_memory} bytes cannot hold {slots} state slots"
        )
    cap = checkpoint_capacity(cache.state_checkpoint_budget, cache.kv_cache_memory, layout)
    room = 0
    if cache.num_state_slots is None and cache.enable_prefix_caching and cap:
        room = checkpoint_room(layout, cache.kv_cache_memory - slots * layout.total_state_slot_bytes(), need, cap)  # fmt: skip
        num_blocks = layout.num_blocks_for(cache.kv_cache_memory, slots + room)
    return CacheSizing(max(num_blocks, 2), slots + room, cap, room)


def checkpoint_room(layout: KVCacheLayout, left: int, need: int, cap: int) -> int:
    """Slots per state group added for checkpoints when ``num_state_slots`` is not set: the
    budget's ``cap``, as far as ``left`` bytes (after the live slots) still hold ``need``
    blocks. The default pool (3 per running request + 16: live, trailing and pending states)
    left ~2 checkpoints per running request whatever the budget: Granite's second pass over 32
    prompts at 16 running hit 752 of 6,297 prompt tokens, 6,048 with this room
    (docs/benchmarks.md, ninth session)."""
    spare = left - (need * layout.page_bytes if layout.attention_group_ids else 0)
    return max(0, min(cap, spare // layout.total_state_slot_bytes()))


def resolve_dtype(dtype: str, raw_config: dict[str, object]) -> str:
    """``auto`` takes the checkpoint's dtype: bfloat16 stays bfloat16, anything else float32."""
    if dtype != "auto":
        return dtype
    stored = raw_config.get("dtype") or raw_config.get("torch_dtype")
    return "bfloat16" if stored == "bfloat16" else "float32"

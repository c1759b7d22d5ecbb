"""The start-up summary an engine logs once (``LLM`` and ``hybridkv serve``): what runs, how the
cache is laid out, and how much it holds (vLLM logs its KV cache size and concurrency the same
way)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hybridkv.kv.spec import SlidingWindowSpec

if TYPE_CHECKING:
    from hybridkv.engine.core import EngineCore


@dataclass(frozen=True, slots=True)
class CacheCapacity:
    num_blocks: int  # usable KV blocks (the null block excluded)
    block_size: int
    num_state_slots: int
    num_attention_groups: int
    blocks_per_request: int  # KV blocks one request of max_model_len tokens holds at once
    max_model_len: int
    max_num_seqs: int

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV blocks hold: each token takes a block slot in every attention group
        (sliding-window groups free theirs, so this is a lower bound for them)."""
        return self.num_blocks * self.block_size // max(self.num_attention_groups, 1)

    @property
    def max_concurrency(self) -> float:
        """Requests of max_model_len tokens that fit at once: KV blocks and live state slots
        (one each) bound it, as does max_num_seqs."""
        bounds = [float(self.max_num_seqs)]
        if self.blocks_per_request:
            bounds.append(self.num_blocks / self.blocks_per_request)
        if self.num_state_slots:
            bounds.append(float(self.num_state_slots))
        return min(bounds)


def capacity(engine: EngineCore) -> CacheCapacity:
    layout, block = engine.layout, engine.layout.block_size
    per_request = 0
    for gid in layout.attention_group_ids:
        spec = layout.groups[gid].spec
        blocks = -(-engine.max_model_len // block)
        if isinstance(spec, SlidingWindowSpec):  # blocks behind the window are freed
            blocks = min(blocks, -(-(spec.sliding_window - 1) // block) + 1)
        per_request += blocks
    return CacheCapacity(
        num_blocks=engine.sizing.num_blocks - 1,
        block_size=block,
        num_attention_groups=len(layout.attention_group_ids),
        num_state_slots=engine.sizing.num_state_slots,
        blocks_per_request=per_request,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.config.scheduler.max_num_seqs,
    )


def startup_summary(engine: EngineCore) -> str:
    """A few lines: model, dtype, layout groups, capacity, concurrency, connector and tiers."""
    cap = capacity(engine)
    layout = engine.layout
    kinds: dict[str, int] = {}
    for g in layout.groups:
        kinds[g.kind.value] = kinds.get(g.kind.value, 0) + 1
    groups = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
    lines = [
        f"model {engine.model_dir} ({engine.model_config.architecture}), dtype {engine.dtype}, "
        f"max_model_len {engine.max_model_len}",
        f"KV cache layout: {len(layout.groups)} groups ({groups}), block size "
        f"{layout.block_size}, {layout.group_size} layers per attention group",
        f"KV cache: {cap.num_blocks} blocks of {layout.page_bytes} bytes, "
        f"{cap.kv_tokens} tokens of capacity; {cap.num_state_slots} state slots",
        f"maximum concurrency for {cap.max_model_len} tokens per request: "
        f"{cap.max_concurrency:.2f}x",
        f"prefix caching {'on' if engine.config.cache.enable_prefix_caching else 'off'}; "
        f"KV connector: {connector_summary(engine)}",
    ]
    if not layout.attention_group_ids:
        lines[2] = f"KV cache: no attention layers; {cap.num_state_slots} state slots"
    return "\n".join(lines)


def connector_summary(engine: EngineCore) -> str:
    config = engine.config.kv_transfer_config
    if config is None:
        return "none"
    extra = config.kv_connector_extra_config
    tiers = [name for key, name in (("cpu_bytes", "cpu"), ("disk_path", "disk"),
                                    ("remote_url", "remote")) if extra.get(key)]  # fmt: skip
    text = f"{config.kv_connector} (role {config.kv_role}, on load failure "
    text += f"{config.kv_load_failure_policy})"
    return text + (f", tiers {' > '.join(tiers)}" if tiers else "")


def cache_info(engine: EngineCore) -> dict[str, object]:
    """The labels of ``hybridkv:cache_config_info`` and ``vllm:cache_config_info``
    (``metrics/table.py``)."""
    cache = engine.config.cache
    return {
        "block_size": engine.layout.block_size,
        "num_blocks": engine.sizing.num_blocks,
        "num_state_slots": engine.sizing.num_state_slots,
        "num_layout_groups": len(engine.layout.groups),
        "enable_prefix_caching": cache.enable_prefix_caching,
        "cache_dtype": engine.dtype,
        "kv_cache_memory": cache.kv_cache_memory,
        "state_checkpoint_interval": cache.state_checkpoint_interval,
        "prefix_caching_hash_algo": cache.prefix_caching_hash_algo,
    }

"""vLLM 0.32's scheduler-side objects, built the way its engine builds them, with no GPU and
no weights: shared by ``prefix_trace_vllm.py``, ``vllm_kv_baseline.py`` and
``vllm_sched_baseline.py``.

Runs in vLLM's own virtualenv: it imports only vLLM (inside the functions, so the project's
venv can import the scripts that use it, e.g. for ``vllm_kv_baseline._hf_config``) and the
standard library, never hybridkv. The steps, in the order the engine takes them::

    EngineArgs(...).create_engine_config()     the caller (its model dir and arguments)
    force_block_sizes(vc, backends)            the executor's update_block_size_for_backend
    plan_kv_cache(vc, specs, memory, ...)      EngineCore._initialize_kv_caches
    create_scheduler(vc, kv_cfg, ...)          EngineCore's Scheduler and request block hasher

Each function mutates ``vc`` exactly as the vLLM step it stands for does (block sizes,
``num_gpu_blocks``, the KV cache layout) and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def force_block_sizes(vc: Any, backends: list[Any]) -> None:
    """``current_platform.update_block_size_for_backend(vc)``, as the executor calls it once
    the model's layers exist: this is where vLLM enlarges the attention block of Mamba/GDN
    hybrids. No model is built here, so the platform is handed ``backends``, the attention
    backends it would select; its own lookup is restored afterwards."""
    from vllm.platforms import current_platform

    platform_cls = type(current_platform)
    saved = platform_cls.__dict__.get("_find_non_ssm_backends")
    platform_cls._find_non_ssm_backends = classmethod(lambda cls, _cfg: list(backends))
    try:
        current_platform.update_block_size_for_backend(vc)
    finally:
        if saved is None:
            del platform_cls._find_non_ssm_backends
        else:
            platform_cls._find_non_ssm_backends = saved


def plan_kv_cache(
    vc: Any, specs: dict[str, Any], memory: int, backends: Callable[[], list[Any]]
) -> tuple[Any, int, int, int]:
    """vLLM's scheduler ``KVCacheConfig`` for the per-layer ``specs`` in ``memory`` bytes,
    planned as ``EngineCore._initialize_kv_caches`` does (``backends`` is called only when the
    KV cache layout is still unresolved). Sets ``num_gpu_blocks`` and ``block_size`` (the
    smallest block of the prefix-cacheable groups) on ``vc.cache_config``, and the hash block
    size and hit alignment on the config. Returns (kv_cache_config, scheduler_block_size,
    hash_block_size, cache_hit_alignment_tokens)."""
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_kv_cache_configs,
        resolve_cache_hit_alignment_tokens,
        resolve_kv_cache_block_sizes,
    )

    if vc.cache_config.kv_cache_layout is None:
        # EngineCore resolves the memory layout from the workers' attention backends before
        # planning; it only affects tensor placement, not the manager's bookkeeping.
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            resolve_kv_cache_layout,
        )

        names = [x.name for x in get_supported_kv_cache_layouts(backends())]
        resolve_kv_cache_layout(vc, [names], list(specs.values()))
    kv_cfg = generate_scheduler_kv_cache_config(get_kv_cache_configs(vc, [specs], [memory]))
    # As EngineCore._initialize_kv_caches does after profiling.
    vc.cache_config.num_gpu_blocks = kv_cfg.num_blocks
    vc.cache_config.block_size = min(
        g.kv_cache_spec.block_size
        for g in kv_cfg.kv_cache_groups
        if g.kv_cache_spec.prefix_cacheable
    )
    sched_bs, hash_bs = resolve_kv_cache_block_sizes(kv_cfg, vc)
    align = resolve_cache_hit_alignment_tokens(kv_cfg, vc, sched_bs, hash_bs)
    kv_cfg.hash_block_size = hash_bs
    kv_cfg.cache_hit_alignment_tokens = align
    return kv_cfg, sched_bs, hash_bs, align


def create_scheduler(vc: Any, kv_cfg: Any, sched_bs: int, hash_bs: int) -> tuple[Any, Any]:
    """vLLM's ``Scheduler`` as ``EngineCore`` builds it (no connector, no speculation, no
    stats) and the request block hasher ``EngineCore`` hands every ``Request``; initialises
    vLLM's global none-hash for the configured hash algorithm."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    sched = Scheduler(
        vllm_config=vc,
        kv_cache_config=kv_cfg,
        structured_output_manager=StructuredOutputManager(vc),
        block_size=sched_bs,
        hash_block_size=hash_bs,
        include_finished_set=False,
        log_stats=False,
    )
    hash_fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    return sched, get_request_block_hasher(hash_bs, hash_fn)


def group_info(kv_cfg: Any) -> list[dict[str, Any]]:
    """Each KV cache group's spec class, layer count, block size and page size (reports)."""
    return [
        {
            "spec": type(g.kv_cache_spec).__name__,
            "num_layers": len(g.layer_names),
            "block_size": g.kv_cache_spec.block_size,
            "page_size_bytes": g.kv_cache_spec.page_size_bytes,
        }
        for g in kv_cfg.kv_cache_groups
    ]

"""Baseline: vLLM's own KV cache manager on the shared workload of ``kv_workload.py``.

Run with the separate vLLM virtualenv (see ``benchmarks/setup_vllm_baseline.sh``), never with
the project's ``.venv``::

    /work/vllm-venv/bin/python benchmarks/vllm_kv_baseline.py            # 10,000 requests
    /work/vllm-venv/bin/python benchmarks/vllm_kv_baseline.py --quick    # 200 requests, 1 run

For each layout (gemma3, qwen35) the script builds vLLM's configuration the way the engine
does, without a GPU and without weights (the steps shared with the other vLLM baselines are in
``vllm_setup.py``): a ``VllmConfig`` from a synthetic local HF
``config.json`` (``EngineArgs(..., load_format="dummy", skip_tokenizer_init=True)``), then
``current_platform.update_block_size_for_backend`` (this is where vLLM enlarges the block
size of Mamba/GDN hybrids), per-layer ``KVCacheSpec`` objects built from vLLM's spec classes
with the fields vLLM's layers would report, ``get_kv_cache_configs`` with
``available_memory = kv_workload.pool_bytes(layout)``, ``generate_scheduler_kv_cache_config``,
``resolve_kv_cache_block_sizes`` / ``resolve_cache_hit_alignment_tokens`` and finally a
``KVCacheManager`` constructed with the arguments ``Scheduler.__init__`` passes it.

Requests are vLLM ``Request`` objects; their block hashes come from
``get_request_block_hasher`` exactly as ``EngineCore`` wires it (hashing timed separately).
Per request it times (a) ``get_computed_blocks`` and (b) ``allocate_slots`` of the whole prompt
(which caches its full blocks) + ``free``. Each (layout, hash) pair is run ``--repeats``
times on a fresh manager after one warm-up pass; medians/min/max are over the per-run means.
Prints one JSON object on stdout (logs go to stderr).

Notes on what vLLM does with this workload (0.32.0):

* After ``get_computed_blocks`` the script stores the returned shared-prefix junction on the
  request (``request.shared_prefix_boundary``), as ``Scheduler.schedule`` does. With the
  default ``prefix_cache_retention_interval = 0`` sliding-window groups only cache the blocks
  reachable from such junctions and the prompt end, so the first request of a prefix caches no
  SWA blocks for it, the second detects the junction (and misses), the third onward hit.
* Sliding-window specs use the requested block size (16). vLLM's CPU attention backend only
  runs multiples of 32 and its ``Attention.get_kv_cache_spec`` would pick 32 for SWA layers
  on CPU; a GPU backend runs 16, which is what the manager comparison wants.
* qwen35: vLLM enlarges the attention block so one attention page holds a GDN state
  (reported as ``block_size_used``); the 1024-token shared prefix is shorter than one such
  block, so no hit is possible.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # keep stdout pure JSON

import bench_common
import kv_workload as wl  # noqa: E402
import vllm_setup  # noqa: E402

HASH_ALGOS = ("sha256", "xxhash")
MAX_MODEL_LEN = 4096


def _hf_config(layout: str) -> dict:
    """A synthetic HF config with the geometry of ``layout`` (no weights are ever loaded)."""
    cfg = wl.LAYOUTS[layout]
    fa = cfg["full_attention"]
    if layout == "gemma3":
        sw = cfg["sliding_window"]
        return {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "num_hidden_layers": len(cfg["layer_kinds"]),
            "num_attention_heads": 16,
            "num_key_value_heads": fa["num_kv_heads"],
            "head_dim": fa["head_size"],
            "sliding_window": sw["window"],
            "layer_types": [
                "full_attention" if k == "full_attention" else "sliding_attention"
                for k in cfg["layer_kinds"]
            ],
            "vocab_size": wl.VOCAB,
            "max_position_embeddings": 32768,
            "torch_dtype": fa["dtype"],
            "rms_norm_eps": 1e-6,
        }
    if layout == "qwen35":
        g = cfg["gdn"]
        return {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "hidden_size": 2048,
            "intermediate_size": 5120,
            "num_hidden_layers": len(cfg["layer_kinds"]),
            "num_attention_heads": 16,
            "num_key_value_heads": fa["num_kv_heads"],
            "head_dim": fa["head_size"],
            "linear_num_key_heads": g["num_k_heads"],
            "linear_key_head_dim": g["head_k_dim"],
            "linear_num_value_heads": g["num_v_heads"],
            "linear_value_head_dim": g["head_v_dim"],
            "linear_conv_kernel_dim": g["conv_kernel"],
            "full_attention_interval": 4,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 256,
            "shared_expert_intermediate_size": 256,
            "decoder_sparse_step": 1,
            "vocab_size": wl.VOCAB,
            "max_position_embeddings": 32768,
            "torch_dtype": fa["dtype"],
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "rms_norm_eps": 1e-6,
        }
    raise ValueError(layout)


def build_vllm_config(layout: str, hash_algo: str, workdir: str, **engine_overrides):
    from vllm.engine.arg_utils import EngineArgs

    model_dir = Path(workdir) / layout
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(_hf_config(layout)))
    extra = {}
    if layout == "qwen35":
        extra["mamba_ssm_cache_dtype"] = wl.LAYOUTS[layout]["gdn"]["recurrent_dtype"]
    args = EngineArgs(
        model=str(model_dir),
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=MAX_MODEL_LEN,
        block_size=wl.LAYOUTS[layout]["block_size"],
        enable_prefix_caching=True,
        prefix_caching_hash_algo=hash_algo,
        **{**extra, **engine_overrides},
    )
    vllm_config = args.create_engine_config()
    vllm_setup.force_block_sizes(vllm_config, _attention_backends(layout, vllm_config))
    return vllm_config


def _attention_backends(layout: str, vllm_config) -> list:
    import torch
    from vllm.config.vllm import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    cfg = wl.LAYOUTS[layout]
    out = []
    with set_current_vllm_config(vllm_config):
        for kind in ("full_attention", "sliding_window"):
            if kind in cfg:
                be = get_attn_backend(
                    cfg[kind]["head_size"],
                    torch.bfloat16,
                    vllm_config.cache_config.cache_dtype,
                    num_heads=16,
                    has_sliding_window=kind == "sliding_window",
                )
                if be not in out:
                    out.append(be)
    return out


def _gdn_state(vllm_config):
    """GDN state shapes/dtypes as vLLM's model class computes them from the config."""
    from vllm.model_executor.models import ModelRegistry

    mc = vllm_config.model_config
    model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
    shapes = tuple(tuple(x) for x in model_cls.get_mamba_state_shape_from_config(vllm_config))
    dtypes = tuple(model_cls.get_mamba_state_dtype_from_config(vllm_config))
    got = sum(math.prod(sh) * dt.itemsize for sh, dt in zip(shapes, dtypes, strict=True))
    want = wl.gdn_state_bytes(wl.LAYOUTS["qwen35"]["gdn"])
    if got != want:
        raise RuntimeError(f"vLLM GDN state is {got} bytes per layer, workload says {want}")
    return shapes, dtypes


def build_layer_specs(layout: str, vllm_config) -> dict:
    """Per-layer KV cache specs, with the fields vLLM's Attention / GDN layers report."""
    import torch
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    cfg = wl.LAYOUTS[layout]
    cc = vllm_config.cache_config
    dt = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
    specs = {}
    for i, kind in enumerate(cfg["layer_kinds"]):
        name = f"model.layers.{i}.attn"
        if kind == "full_attention":
            fa = cfg["full_attention"]
            specs[name] = FullAttentionSpec(
                block_size=cc.block_size,
                num_kv_heads=fa["num_kv_heads"],
                head_size=fa["head_size"],
                dtype=dt[fa["dtype"]],
            )
        elif kind == "sliding_window":
            sw = cfg["sliding_window"]
            specs[name] = SlidingWindowSpec(
                block_size=cc.block_size,
                num_kv_heads=sw["num_kv_heads"],
                head_size=sw["head_size"],
                dtype=dt[sw["dtype"]],
                sliding_window=sw["window"],
            )
        elif kind == "gdn":
            shapes, dtypes = _gdn_state(vllm_config)
            specs[name] = MambaSpec(
                shapes=shapes,
                dtypes=dtypes,
                block_size=cc.mamba_block_size,
                page_size_padded=cc.mamba_page_size_padded,
                mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
                mamba_cache_mode=cc.mamba_cache_mode,
                num_speculative_blocks=0,
            )
    return specs


def build_kv_cache_config(layout: str, vllm_config, pool_bytes: int | None = None):
    """vLLM's KVCacheConfig for ``layout`` given ``pool_bytes`` of memory, planned as
    ``EngineCore._initialize_kv_caches`` does. Returns (config, scheduler_block_size,
    hash_block_size, cache_hit_alignment_tokens)."""
    if pool_bytes is None:
        pool_bytes = wl.pool_bytes(layout)
    specs = build_layer_specs(layout, vllm_config)
    return vllm_setup.plan_kv_cache(
        vllm_config, specs, pool_bytes, lambda: _attention_backends(layout, vllm_config)
    )


def build_manager(layout: str, vllm_config):
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    kv_cfg, sched_bs, hash_bs, align = build_kv_cache_config(layout, vllm_config)
    # As Scheduler.__init__ constructs it (no spec decode, no connector, no events).
    mgr = KVCacheManager(
        kv_cache_config=kv_cfg,
        max_model_len=vllm_config.model_config.max_model_len,
        max_in_flight_tokens=vllm_config.max_in_flight_tokens,
        enable_caching=True,
        use_eagle=False,
        num_prefill_lookahead=vllm_config.num_prefill_lookahead_tokens,
        log_stats=False,
        enable_kv_cache_events=False,
        dcp_world_size=1,
        pcp_world_size=1,
        scheduler_block_size=sched_bs,
        hash_block_size=hash_bs,
        metrics_collector=None,
        watermark=vllm_config.scheduler_config.watermark,
        enable_mamba_shared_prefix_checkpoint=(
            vllm_config.cache_config.enable_mamba_shared_prefix_checkpoint
        ),
    )
    info = {
        "num_blocks": kv_cfg.num_blocks,
        "groups": vllm_setup.group_info(kv_cfg),
        "block_size_requested": wl.LAYOUTS[layout]["block_size"],
        "block_size_used": vllm_config.cache_config.block_size,
        "mamba_block_size": vllm_config.cache_config.mamba_block_size,
        "mamba_cache_mode": vllm_config.cache_config.mamba_cache_mode,
        "mamba_page_size_padded": vllm_config.cache_config.mamba_page_size_padded,
        "scheduler_block_size": sched_bs,
        "hash_block_size": hash_bs,
        "cache_hit_alignment_tokens": align,
        "prefix_cache_retention_interval": vllm_config.cache_config.prefix_cache_retention_interval,
        "pool_bytes": wl.pool_bytes(layout),
        "coordinator": type(mgr.coordinator).__name__,
    }
    if "gdn" in wl.LAYOUTS[layout]:
        shapes, dtypes = _gdn_state(vllm_config)
        info["gdn_state_shapes"] = [list(x) for x in shapes]
        info["gdn_state_dtypes"] = [str(d).replace("torch.", "") for d in dtypes]
    return mgr, info


# --clock cpu: this thread's CPU time (steady while other jobs share the machine)
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
CLOCK = CLOCKS["wall"]


def run_once(mgr, prompts, hasher, sampling_params, tag: str) -> dict:
    """One pass over the workload on ``mgr``; returns totals in seconds and hit tokens."""
    from vllm.v1.request import Request

    t_build = t_hash = t_hit = t_alloc = 0.0
    hit_tokens = prompt_tokens = 0
    failures = new_blocks = 0
    clock = CLOCK
    for i, prompt in enumerate(prompts):
        t0 = clock()
        req = Request(f"{tag}-{i}", prompt, sampling_params, None, block_hasher=None)
        t1 = clock()
        # Equivalent to Request(..., block_hasher=hasher): __init__ stores the hasher and
        # calls update_block_hashes(); split here so hashing is timed on its own.
        req._block_hasher = hasher
        req.update_block_hashes()
        t2 = clock()
        blocks, n_hit, junction = mgr.get_computed_blocks(req)
        t3 = clock()
        # The scheduler stores the detected shared-prefix junction on the request; the
        # sparse-retention SWA/Mamba managers then cache a checkpoint there.
        req.shared_prefix_boundary = junction
        new = mgr.allocate_slots(req, len(prompt) - n_hit, n_hit, blocks)
        t4 = clock()
        # (untimed) bookkeeping for the report
        if new is None:
            failures += 1
        else:
            new_blocks += sum(1 for g in new.blocks for b in g if not b.is_null)
        t5 = clock()
        mgr.free(req)
        t6 = clock()
        t_build += t1 - t0
        t_hash += t2 - t1
        t_hit += t3 - t2
        t_alloc += (t4 - t3) + (t6 - t5)
        hit_tokens += n_hit
        prompt_tokens += len(prompt)
    return {
        "build": t_build,
        "hash": t_hash,
        "hit": t_hit,
        "alloc": t_alloc,
        "hit_tokens": hit_tokens,
        "prompt_tokens": prompt_tokens,
        "failures": failures,
        "new_blocks": new_blocks,
        "cached_blocks_at_end": len(mgr.block_pool.cached_block_hash_to_block._cache),
    }


def bench(layout: str, hash_algo: str, prompts, repeats: int, warmup: bool, workdir: str):
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    vllm_config = build_vllm_config(layout, hash_algo, workdir)
    hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    sp = SamplingParams(max_tokens=1)
    runs = []
    info = None
    for r in range(repeats + (1 if warmup else 0)):
        mgr, info = build_manager(layout, vllm_config)
        hasher = get_request_block_hasher(info["hash_block_size"], hash_fn)
        gc.collect()
        res = run_once(mgr, prompts, hasher, sp, f"{layout}-{hash_algo}-{r}")
        if warmup and r == 0:
            continue
        runs.append(res)
    n = len(prompts)
    last = runs[-1]
    return {
        **info,
        "hash_algo": hash_algo,
        "num_requests": n,
        "repeats": len(runs),
        "us_per_request": wl.us_per_request(runs, n),
        "hit_token_rate": round(last["hit_tokens"] / last["prompt_tokens"], 6),
        "hit_tokens": last["hit_tokens"],
        "prompt_tokens": last["prompt_tokens"],
        "ideal_hit_token_rate_at_this_block_size": round(
            wl.ideal_hit_tokens(n, info["cache_hit_alignment_tokens"]) / last["prompt_tokens"], 6
        ),
        "allocation_failures": last["failures"],
        # More fresh blocks than the pool holds means cached blocks were evicted.
        "fresh_blocks_allocated_per_run": last["new_blocks"],
        "cached_block_keys_at_end": last["cached_blocks_at_end"],
    }


def machine_info() -> dict:
    import vllm

    return bench_common.machine_info(vllm=vllm.__version__)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=wl.DEFAULT_NUM_REQUESTS)
    p.add_argument("--repeats", type=int, default=5, help="timed runs after one warm-up")
    p.add_argument("--quick", action="store_true", help="200 requests, 1 run, no warm-up")
    p.add_argument("--layouts", default=",".join(wl.LAYOUTS))
    p.add_argument("--hash-algos", default=",".join(HASH_ALGOS))
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    a = p.parse_args(argv)
    global CLOCK
    CLOCK = CLOCKS[a.clock]
    n, repeats, warmup = a.num_requests, a.repeats, True
    if a.quick:
        n, repeats, warmup = wl.QUICK_NUM_REQUESTS, 1, False
    logging.getLogger("vllm").setLevel(logging.WARNING)

    prompts = wl.make_requests(n)
    out: dict = {
        "benchmark": "vllm_kv_baseline",
        "machine": machine_info(),
        "workload": {
            "num_requests": n,
            "prompt_len": wl.PROMPT_LEN,
            "num_prefixes": wl.NUM_PREFIXES,
            "prefix_len": wl.PREFIX_LEN,
            "vocab": wl.VOCAB,
            "seed": wl.SEED,
            "pool_tokens": wl.POOL_TOKENS,
            "pool_state_slots": wl.POOL_STATE_SLOTS,
            "operations": list(wl.OPERATIONS),
            "stat": "per-run mean us/request; median/min/max over runs",
            "warmup_runs": 1 if warmup else 0,
        },
        "results": {},
    }
    from vllm.utils import hashing

    with tempfile.TemporaryDirectory(prefix="vllm-kv-baseline-") as workdir:
        for layout in a.layouts.split(","):
            out["results"][layout] = {}
            for algo in a.hash_algos.split(","):
                if algo.startswith("xxhash") and hashing._xxhash is None:
                    out["results"][layout][algo] = {"skipped": "xxhash package not installed"}
                    continue
                print(f"[vllm_kv_baseline] {layout} {algo} n={n} ...", file=sys.stderr)
                out["results"][layout][algo] = bench(
                    layout, algo, prompts, repeats, warmup, workdir
                )
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

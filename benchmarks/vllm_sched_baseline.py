"""Baseline (B2): vLLM's own ``Scheduler`` step cost with 256 decoding requests, no model.

Run with the separate vLLM virtualenv (``benchmarks/setup_vllm_baseline.sh``)::

    /work/vllm-venv/bin/python benchmarks/vllm_sched_baseline.py          # 5 x 100 steps
    /work/vllm-venv/bin/python benchmarks/vllm_sched_baseline.py --quick  # 1 x 10 steps

Layout ``qwen35`` from ``kv_workload.py`` (36 GDN + 12 full attention), configured exactly as
``vllm_kv_baseline.py`` does (synthetic local HF config, vLLM's block-size forcing,
``get_kv_cache_configs`` on ``kv_workload.pool_bytes(layout, SCHED_POOL_TOKENS,
SCHED_STATE_SLOTS)``), prefix caching on (SHA-256), synchronous scheduling
(``vllm.v1.core.sched.scheduler.Scheduler``). The workload (see ``kv_workload``): 256 requests
with 512-token private prompts are added and prefilled (untimed; the fake runner reports no
token for partial prefill chunks and one token once the prompt is done), then every step is
``schedule()`` + ``update_from_output()`` with a fake ``ModelRunnerOutput`` carrying one
sampled token per running request. Reported: microseconds per step (schedule, update, sum),
median/min/max over runs of per-run means, after warm-up steps. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # keep stdout pure JSON

import kv_workload as wl  # noqa: E402
import vllm_kv_baseline as kvb  # noqa: E402
import vllm_setup  # noqa: E402

LAYOUT = "qwen35"


def fake_output(sched_out, requests: dict, rng: random.Random):
    """One sampled token for every scheduled request whose prompt is fully computed."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(sched_out.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        req = requests[rid]
        done = req.num_computed_tokens >= req.num_tokens
        sampled.append([rng.randrange(wl.VOCAB)] if done else [])
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )


def build_scheduler(workdir: str, hash_algo: str = "sha256"):
    vc = kvb.build_vllm_config(
        LAYOUT,
        hash_algo,
        workdir,
        max_num_seqs=wl.SCHED_NUM_RUNNING,
        async_scheduling=False,
    )
    pool = wl.pool_bytes(LAYOUT, wl.SCHED_POOL_TOKENS, wl.SCHED_STATE_SLOTS)
    kv_cfg, sched_bs, hash_bs, align = kvb.build_kv_cache_config(LAYOUT, vc, pool)
    sched, hasher = vllm_setup.create_scheduler(vc, kv_cfg, sched_bs, hash_bs)
    info = {
        "scheduler_class": type(sched).__name__,
        "num_blocks": kv_cfg.num_blocks,
        "block_size_used": vc.cache_config.block_size,
        "mamba_block_size": vc.cache_config.mamba_block_size,
        "mamba_cache_mode": vc.cache_config.mamba_cache_mode,
        "hash_block_size": hash_bs,
        "scheduler_block_size": sched_bs,
        "cache_hit_alignment_tokens": align,
        "max_num_seqs": vc.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
        "async_scheduling": vc.scheduler_config.async_scheduling,
        "pool_bytes": pool,
        "groups": [
            {"spec": type(g.kv_cache_spec).__name__, "num_layers": len(g.layer_names)}
            for g in kv_cfg.kv_cache_groups
        ],
    }
    return sched, hasher, info


def run_once(workdir: str, steps: int, warmup_steps: int, seed: int) -> tuple[dict, dict]:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    sched, hasher, info = build_scheduler(workdir)
    prompts = wl.make_requests(
        wl.SCHED_NUM_RUNNING, wl.SCHED_PROMPT_LEN, num_prefixes=0, prefix_len=0, seed=seed
    )
    sp = SamplingParams(max_tokens=wl.SCHED_MAX_TOKENS, ignore_eos=True)
    requests = {}
    for i, p in enumerate(prompts):
        req = Request(f"r{i}", p, sp, None, block_hasher=hasher)
        requests[req.request_id] = req
        sched.add_request(req)
    rng = random.Random(seed)

    # Prefill until every request is decoding (untimed).
    prefill_steps = 0
    while True:
        out = sched.schedule()
        sched.update_from_output(out, fake_output(out, requests, rng))
        prefill_steps += 1
        decoding = all(r.num_computed_tokens >= r.num_prompt_tokens for r in requests.values())
        if decoding and len(sched.running) == wl.SCHED_NUM_RUNNING:
            break
        if prefill_steps > 10_000:
            raise RuntimeError("prefill did not converge")

    t_sched = t_upd = 0.0
    batch_sizes = []
    clock = time.perf_counter
    gc.collect()
    for step in range(warmup_steps + steps):
        t0 = clock()
        out = sched.schedule()
        t1 = clock()
        mro = fake_output(out, requests, rng)
        t2 = clock()
        sched.update_from_output(out, mro)
        t3 = clock()
        if step >= warmup_steps:
            t_sched += t1 - t0
            t_upd += t3 - t2
            batch_sizes.append(len(out.num_scheduled_tokens))
    info["prefill_steps"] = prefill_steps
    info["min_batch"] = min(batch_sizes)
    info["max_batch"] = max(batch_sizes)
    info["preempted_during_timed_steps"] = sum(1 for r in requests.values() if r.num_preemptions)
    return {"schedule": t_sched / steps, "update": t_upd / steps}, info


def _stats(xs: list[float]) -> dict:
    us = [x * 1e6 for x in xs]
    return {
        "median": round(statistics.median(us), 2),
        "min": round(min(us), 2),
        "max": round(max(us), 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=wl.SCHED_STEPS_PER_RUN)
    p.add_argument("--quick", action="store_true", help="1 run of 10 steps, 2 warm-up steps")
    a = p.parse_args(argv)
    repeats, steps, warmup = a.repeats, a.steps, wl.SCHED_WARMUP_STEPS
    if a.quick:
        repeats, steps, warmup = 1, 10, 2
    runs = []
    info: dict = {}
    with tempfile.TemporaryDirectory(prefix="vllm-sched-baseline-") as workdir:
        for r in range(repeats):
            print(f"[vllm_sched_baseline] run {r + 1}/{repeats}", file=sys.stderr)
            res, info = run_once(workdir, steps, warmup, seed=r)
            runs.append(res)
    out = {
        "benchmark": "vllm_sched_baseline",
        "machine": kvb.machine_info(),
        "layout": LAYOUT,
        "workload": {
            "num_running": wl.SCHED_NUM_RUNNING,
            "prompt_len": wl.SCHED_PROMPT_LEN,
            "max_tokens": wl.SCHED_MAX_TOKENS,
            "warmup_steps": warmup,
            "steps_per_run": steps,
            "runs": repeats,
            "stat": "per-run mean us/step; median/min/max over runs",
        },
        "config": info,
        "us_per_step": {
            "schedule": _stats([x["schedule"] for x in runs]),
            "update_from_output": _stats([x["update"] for x in runs]),
            "total": _stats([x["schedule"] + x["update"] for x in runs]),
        },
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

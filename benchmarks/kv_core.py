"""B2-style control-plane benchmark of hybridkv's KV core (no model, no tensors).

Feeds the shared workload of ``benchmarks/kv_workload.py`` (10,000 requests of 2,000 tokens,
each one of 10 shared 1,024-token prefixes + its own tail) through ``KVCacheCoordinator`` on
the Gemma-3-like and Qwen3.5-like layouts, one request at a time, and times per request:

* ``hash``: the prompt's chained block hashes (SHA-256 or xxh3-128), timed on its own;
* ``hit_search``: ``find_cache_hit``;
* ``alloc_cache_free``: ``allocate`` of the whole prompt in one call + ``cache`` of its KV (and
  state checkpoints) + ``free``.

Each (layout, hash) pair runs once as a warm-up, then ``--repeats`` times on a fresh
coordinator; numbers are the per-run mean microseconds per request, median/min/max over runs.
When ``/work/vllm-venv/bin/python`` and ``benchmarks/vllm_kv_baseline.py`` exist, the same
workload goes through vLLM's KV cache manager in a subprocess in the same run, alternating
rounds (hybridkv, vLLM, hybridkv, vLLM, ...), and the ratio hybridkv / vLLM is reported.

    .venv/bin/python benchmarks/kv_core.py            # full run (+ vLLM baseline if present)
    .venv/bin/python benchmarks/kv_core.py --quick    # 200 requests, 1 run, seconds
    .venv/bin/python benchmarks/kv_core.py --clock cpu --layouts gemma3   # on a shared machine

``--clock cpu`` times each engine's own thread CPU time (``time.thread_time``, in both
processes) instead of wall time: ratios then hold while other jobs share the machine.

Prints one JSON object on stdout (progress goes to stderr).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_common import machine_info

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import kv_workload as wl  # noqa: E402
from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator  # noqa: E402
from hybridkv.kv.hashing import BlockHash, BlockHasher, get_hash_fn  # noqa: E402
from hybridkv.kv.spec import (  # noqa: E402
    FullAttentionSpec,
    KVCacheLayout,
    LayerSpec,
    SlidingWindowSpec,
    StateSpec,
    create_layout,
)

# --clock cpu: this thread's CPU time (steady while other jobs share the machine)
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
HASH_ALGOS = {"sha256": "sha256", "xxh3_128": "xxhash"}  # ours -> the baseline's name
VLLM_PYTHON = Path("/work/vllm-venv/bin/python")
BASELINE = HERE / "vllm_kv_baseline.py"


def build_layout(name: str) -> KVCacheLayout:
    """hybridkv layer specs for a layout of ``kv_workload.LAYOUTS``."""
    cfg = wl.LAYOUTS[name]
    bs = cfg["block_size"]
    specs: list[LayerSpec | None] = []
    for kind in cfg["layer_kinds"]:
        if kind == "full_attention":
            fa = cfg["full_attention"]
            specs.append(FullAttentionSpec(bs, fa["num_kv_heads"], fa["head_size"], fa["dtype"]))
        elif kind == "sliding_window":
            sw = cfg["sliding_window"]
            specs.append(
                SlidingWindowSpec(
                    bs, sw["num_kv_heads"], sw["head_size"], sw["dtype"], sw["window"]
                )
            )
        elif kind == "gdn":
            g = cfg["gdn"]
            specs.append(
                StateSpec(
                    "gated_deltanet",
                    (tuple(g["conv_shape"]), tuple(g["recurrent_shape"])),
                    (g["conv_dtype"], g["recurrent_dtype"]),
                )
            )
        else:  # pragma: no cover
            raise ValueError(kind)
    return create_layout(specs, block_size=bs)


def build_coordinator(name: str) -> KVCacheCoordinator:
    layout = build_layout(name)
    slots = wl.POOL_STATE_SLOTS if layout.state_group_ids else 0
    num_blocks = layout.num_blocks_for(wl.pool_bytes(name), slots)
    coord = KVCacheCoordinator(layout, KVCacheConfig(num_blocks=num_blocks, num_state_slots=slots))
    # KV events off, as in the vLLM baseline (nothing consumes them here)
    for pool in [coord.pool] + [sm.pool for sm in coord.state]:
        pool.record_events = False
    return coord


@dataclass
class BenchRequest:
    """The KVRequest protocol, nothing more."""

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int = 0
    block_hashes: list[BlockHash] = field(default_factory=list)
    cache_boundaries: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def run_once(
    name: str, algo: str, prompts: list[list[int]], tag: str, clock: str = "wall"
) -> dict[str, Any]:
    """One pass of the workload on a fresh coordinator; totals in seconds on ``clock``."""
    coord = build_coordinator(name)
    hasher = BlockHasher(coord.block_size, get_hash_fn(algo))
    now = CLOCKS[clock]
    t_hash = t_hit = t_alloc = 0.0
    hit_tokens = prompt_tokens = failures = 0
    gc.collect()
    for i, prompt in enumerate(prompts):
        req = BenchRequest(f"{tag}-{i}", prompt, len(prompt))
        t0 = now()
        hasher.extend(req.block_hashes, prompt)
        t1 = now()
        hit = coord.find_cache_hit(req)
        t2 = now()
        n = len(prompt)
        if coord.allocate(req, n - hit.num_tokens, hit):
            req.num_computed_tokens = n
            coord.cache(req, n)
            coord.take_state_copies()
            coord.end_step()
            coord.free(req)
        else:
            failures += 1
        t3 = now()
        t_hash += t1 - t0
        t_hit += t2 - t1
        t_alloc += t3 - t2
        hit_tokens += hit.num_tokens
        prompt_tokens += n
    coord.check_integrity()
    assert coord.is_idle()
    return {
        "hash": t_hash,
        "hit": t_hit,
        "alloc": t_alloc,
        "hit_tokens": hit_tokens,
        "prompt_tokens": prompt_tokens,
        "failures": failures,
        "num_blocks": coord.pool.num_items,
    }


def summarize(name: str, algo: str, runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    layout = build_layout(name)
    last = runs[-1]
    return {
        "groups": [f"{g.kind.value} x{len(g.layer_ids)}" for g in layout.groups],
        "block_size": layout.block_size,
        "num_blocks": last["num_blocks"],
        "num_state_slots": wl.POOL_STATE_SLOTS if layout.state_group_ids else 0,
        "hash_algo": algo,
        "num_requests": n,
        "repeats": len(runs),
        "us_per_request": wl.us_per_request(runs, n),
        "hit_token_rate": round(last["hit_tokens"] / last["prompt_tokens"], 6),
        "hit_tokens": last["hit_tokens"],
        "ideal_hit_token_rate": round(
            wl.ideal_hit_tokens(n, layout.block_size) / last["prompt_tokens"], 6
        ),
        "allocation_failures": last["failures"],
    }


def baseline_available() -> tuple[bool, str]:
    if not VLLM_PYTHON.exists():
        return False, f"{VLLM_PYTHON} not found (benchmarks/setup_vllm_baseline.sh creates it)"
    if not BASELINE.exists():
        return False, f"{BASELINE.name} not found"
    return True, ""


def run_baseline(
    n: int, repeats: int, layouts: list[str], algos: list[str], clock: str
) -> dict[str, Any]:
    cmd = [
        str(VLLM_PYTHON),
        str(BASELINE),
        "--num-requests",
        str(n),
        "--repeats",
        str(repeats),
        "--layouts",
        ",".join(layouts),
        "--hash-algos",
        ",".join(HASH_ALGOS[a] for a in algos),
        "--clock",
        clock,
    ]
    print(f"[kv_core] baseline: {' '.join(cmd)}", file=sys.stderr)
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent)
    if res.returncode != 0:
        raise RuntimeError(f"baseline failed ({res.returncode}): {res.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=wl.DEFAULT_NUM_REQUESTS)
    p.add_argument("--repeats", type=int, default=3, help="timed runs per round, after one warm-up")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds: hybridkv, vLLM, ...")
    p.add_argument(
        "--quick", action="store_true", help="200 requests, 1 run, no warm-up, no baseline"
    )
    p.add_argument("--layouts", default=",".join(wl.LAYOUTS))
    p.add_argument("--hash-algos", default=",".join(HASH_ALGOS))
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="cpu: each process's own CPU time, for ratios on a shared machine",
    )
    a = p.parse_args(argv)
    n, repeats, rounds, warmup = a.num_requests, a.repeats, a.rounds, True
    if a.quick:
        n, repeats, rounds, warmup = wl.QUICK_NUM_REQUESTS, 1, 1, False
    layouts, algos = a.layouts.split(","), a.hash_algos.split(",")

    do_baseline, why = baseline_available()
    if a.quick:
        do_baseline, why = False, "--quick (the baseline alone takes ~20 s to start vLLM)"
    elif a.no_baseline:
        do_baseline, why = False, "--no-baseline"

    prompts = wl.make_requests(n)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {
        (lay, alg): [] for lay in layouts for alg in algos
    }
    base_runs: list[dict[str, Any]] = []
    started = time.time()
    for rnd in range(rounds):
        for lay in layouts:
            for alg in algos:
                print(f"[kv_core] round {rnd} {lay} {alg} n={n}", file=sys.stderr)
                if warmup:
                    run_once(lay, alg, prompts, f"w{rnd}", a.clock)
                for r in range(repeats):
                    runs[(lay, alg)].append(run_once(lay, alg, prompts, f"{rnd}-{r}", a.clock))
        if do_baseline:
            base_runs.append(run_baseline(n, repeats, layouts, algos, a.clock))

    out: dict[str, Any] = {
        "benchmark": "kv_core",
        "machine": machine_info(),
        "workload": {
            "num_requests": n,
            "prompt_len": wl.PROMPT_LEN,
            "num_prefixes": wl.NUM_PREFIXES,
            "prefix_len": wl.PREFIX_LEN,
            "pool_tokens": wl.POOL_TOKENS,
            "pool_state_slots": wl.POOL_STATE_SLOTS,
            "operations": list(wl.OPERATIONS),
            "stat": "per-run mean us/request; median/min/max over runs",
            "clock": a.clock,
            "rounds": rounds,
            "runs_per_round": repeats,
            "warmup_runs_per_round": 1 if warmup else 0,
        },
        "results": {
            lay: {alg: summarize(lay, alg, runs[(lay, alg)], n) for alg in algos} for lay in layouts
        },
    }
    if do_baseline:
        out["baseline"] = _merge_baseline(base_runs, out["results"], layouts, algos)
    else:
        out["baseline"] = {"skipped": why}
    out["wall_seconds"] = round(time.time() - started, 1)
    print(json.dumps(out, indent=1))
    return 0


def _merge_baseline(
    base_runs: list[dict[str, Any]], ours: dict[str, Any], layouts: list[str], algos: list[str]
) -> dict[str, Any]:
    """vLLM's numbers per round (each round's median) and hybridkv / vLLM ratios."""
    merged: dict[str, Any] = {
        "machine": base_runs[0].get("machine"),
        "rounds": len(base_runs),
        "results": {},
    }
    for lay in layouts:
        merged["results"][lay] = {}
        for alg in algos:
            per_round = [b["results"][lay][HASH_ALGOS[alg]] for b in base_runs]
            if "skipped" in per_round[0]:
                merged["results"][lay][alg] = per_round[0]
                continue
            entry: dict[str, Any] = {
                k: per_round[-1][k]
                for k in (
                    "block_size_used",
                    "num_blocks",
                    "coordinator",
                    "hit_token_rate",
                    "allocation_failures",
                )
                if k in per_round[-1]
            }
            entry["ratio_hybridkv_over_vllm"] = {}
            for op in (
                "hit_search",
                "alloc_cache_free",
                "hit_search_plus_alloc_cache_free",
                "hash",
            ):
                theirs = statistics.median(r["us_per_request"][op]["median"] for r in per_round)
                mine = ours[lay][alg]["us_per_request"][op]["median"]
                entry.setdefault("us_per_request_median", {})[op] = round(theirs, 3)
                entry["ratio_hybridkv_over_vllm"][op] = round(mine / theirs, 3) if theirs else None
            merged["results"][lay][alg] = entry
    return merged


if __name__ == "__main__":
    raise SystemExit(main())

"""B5 — faults: throughput and time-to-first-token while KV loads fail, are corrupted or time out.

One engine per checkpoint, ``FaultInjection`` over a ``FileConnector`` (async loads, policy
``recompute``). A cold run computes every prompt and stores its KV in files: its outputs are the
reference. Each measured run then resets the device prefix cache, so every prompt is an external
hit loaded from the files, and generates the same prompts greedily (``ignore_eos``). Between
runs only the injection config of the worker changes (``FaultInjectionWorker.config``), so all
configurations share the engine, its files and its warm caches::

    0%            no fault (the baseline: ratios are against it, measured in the same round)
    failed N%     block_failure_rate N      (a block or state reported invalid, garbage written)
    corrupt N%    corrupt_rate N            (the same, reported as corrupt)
    request N%    request_failure_rate N    (the whole load fails, as a timed-out transfer does)
    timeout       delay 40 ms > timeout 20 ms: every load times out (FaultInjection has no
                  per-load timeout rate; this is the all-loads worst case)
    disk clean    (``faults_hostile``) the OffloadingConnector's disk tier instead, every
    hostile dir   prompt a disk hit; then every stored part made a FIFO, symlink, forged,
                  foreign, truncated, huge or half-written file before each run
    clean         (``faults_hostile_client``, tiny only) a prefill/decode pair behind the proxy,
    hostile client  honest streamed requests; then the same with 10 % forged, retargeted,
                  huge-number, untrusted-host and stalled-listener params sent to the decode
                  engine: wrong tokens, decode health and honest TTFT p90 against ``clean``

Rounds alternate the configurations (A, B, C, ..., A, B, C, ...) after one warm-up round.
Every run's tokens are compared with the cold run's: the script exits 1 on any wrong token or
errored request. Prints one JSON document on stdout and a table on stderr.

    .venv/bin/python benchmarks/faults.py            # tiny + small, 5 rounds (a few minutes)
    .venv/bin/python benchmarks/faults.py --quick    # seconds; run by the test suite
    .venv/bin/python benchmarks/faults.py --only-hostile-client --sizes tiny   # ~2 minutes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_common import cpu_flags, ensure_checkpoint, machine_info

FIRST_TOKEN_ID = 3  # 0..2 are the tiny tokenizer's special tokens
RATES = (0.01, 0.10)


@dataclass(frozen=True, slots=True)
class Workload:
    num_prompts: int
    prompt_len: int
    shared_prefix: int  # tokens every prompt starts with
    output_len: int
    rounds: int  # measured rounds (one warm-up round is added)


FULL = {
    "tiny": Workload(num_prompts=16, prompt_len=256, shared_prefix=64, output_len=16, rounds=5),
    "small": Workload(num_prompts=4, prompt_len=192, shared_prefix=64, output_len=8, rounds=5),
}
QUICK = {"tiny": Workload(num_prompts=4, prompt_len=64, shared_prefix=16, output_len=4, rounds=1)}


def fault_configs(quick: bool) -> dict[str, dict[str, float]]:
    configs: dict[str, dict[str, float]] = {"0%": {}}
    rates = RATES[1:] if quick else RATES
    for rate in rates:
        pct = f"{rate:.0%}"
        configs[f"failed {pct}"] = {"block_failure_rate": rate}
        configs[f"corrupt {pct}"] = {"corrupt_rate": rate}
        configs[f"request {pct}"] = {"request_failure_rate": rate}
    configs["timeout"] = {"delay_seconds": 0.04, "load_timeout_seconds": 0.02}
    return configs


def make_prompts(vocab_size: int, work: Workload, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(work.shared_prefix)]
    tail = work.prompt_len - work.shared_prefix
    return [
        prefix + [rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(tail)]
        for _ in range(work.num_prompts)
    ]


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def wrong_tokens(got: list[int], want: list[int]) -> int:
    """Positions where ``got`` differs from ``want`` (missing tokens count as wrong)."""
    return sum(a != b for a, b in zip(got, want, strict=False)) + abs(len(got) - len(want))


class Bench:
    """One engine with FaultInjection over a FileConnector; the injection config is swapped."""

    def __init__(self, model: Path, store: Path, work: Workload) -> None:
        from hybridkv import LLM, SamplingParams
        from hybridkv.connectors.fault.connector import FaultInjectionWorker

        inner = {
            "kv_connector": "FileConnector",
            "kv_connector_extra_config": {"path": str(store), "load_mode": "async"},
        }
        config = {
            "kv_connector": "FaultInjection",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"inner": inner},
        }
        self.llm = LLM(
            str(model),
            dtype="float32",
            block_size=16,
            kv_cache_memory="512MiB",
            max_num_seqs=work.num_prompts,
            max_model_len=work.prompt_len + work.output_len + 16,
            kv_transfer_config=config,
        )
        connector = self.llm.engine.connector
        assert connector is not None and isinstance(connector.worker, FaultInjectionWorker)
        self.worker = connector.worker
        self.base = self.worker.config
        self.params = SamplingParams(temperature=0.0, max_tokens=work.output_len, ignore_eos=True)
        self.work = work

    def cold_run(self, prompts: list[list[int]]) -> list[list[int]]:
        """Compute everything and store it in files: the reference tokens."""
        outs = self.llm.generate(prompts, self.params, use_tqdm=False)
        assert self.worker.wait_for_saves(timeout=120.0), "saves did not finish"
        assert all("disk" not in o.cached_tokens for o in outs)
        return [list(o.token_ids) for o in outs]

    def run(self, prompts: list[list[int]], faults: dict[str, float]) -> dict[str, Any]:
        engine = self.llm.engine
        assert engine.kv.reset_prefix_cache(), "the engine must be idle between runs"
        self.worker.config = dataclasses.replace(self.base, **faults)
        stats = engine.scheduler.transfer.stats
        before = (stats.recomputed_tokens, sum(stats.load_failures.values()), stats.failed_requests)
        start = time.perf_counter()
        outs = self.llm.generate(prompts, self.params, use_tqdm=False)
        wall = time.perf_counter() - start
        ttfts = [o.metrics["ttft_s"] for o in outs if "ttft_s" in o.metrics]
        return {
            "wall_s": wall,
            "ttft_s": statistics.median(ttfts) if ttfts else float("nan"),
            "tokens": [list(o.token_ids) for o in outs],
            "errored": sum(o.finish_reason == "error" for o in outs),
            "disk_tokens": sum(o.cached_tokens.get("disk", 0) for o in outs),
            "recomputed_tokens": stats.recomputed_tokens - before[0],
            "failures": sum(stats.load_failures.values()) - before[1],
            "failed_requests": stats.failed_requests - before[2],
        }

    def close(self) -> None:
        self.llm.engine.shutdown()
        assert self.llm.engine.kv.is_idle()
        self.llm.engine.kv.check_integrity()


def bench_checkpoint(
    model: Path, work: Workload, configs: dict[str, dict[str, float]]
) -> dict[str, Any]:
    from hybridkv.model.loading.loader import load_model_config

    vocab = load_model_config(str(model)).vocab_size
    prompts = make_prompts(vocab, work)
    store = Path(tempfile.mkdtemp(prefix="hybridkv-b5-"))
    try:
        bench = Bench(model, store, work)
        reference = bench.cold_run(prompts)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
        for round_no in range(1 + work.rounds):  # round 0 warms up and is not kept
            for name, faults in configs.items():
                result = bench.run(prompts, faults)
                if round_no > 0:
                    runs[name].append(result)
        bench.close()
    finally:
        shutil.rmtree(store, ignore_errors=True)

    out_tokens = work.num_prompts * work.output_len
    base_walls = [r["wall_s"] for r in runs["0%"]]
    results: dict[str, Any] = {}
    for name, rs in runs.items():
        wrong = sum(
            wrong_tokens(got, want)
            for r in rs
            for got, want in zip(r["tokens"], reference, strict=True)
        )
        results[name] = {
            "faults": configs[name],
            "runs": len(rs),
            "output_tok_s": summary([out_tokens / r["wall_s"] for r in rs]),
            "ttft_ms": summary([1000 * r["ttft_s"] for r in rs]),
            "time_vs_0pct": summary([r["wall_s"] / b for r, b in zip(rs, base_walls, strict=True)]),
            "recomputed_tokens_per_run": statistics.mean(r["recomputed_tokens"] for r in rs),
            "failures_per_run": statistics.mean(r["failures"] for r in rs),
            "failed_requests_per_run": statistics.mean(r["failed_requests"] for r in rs),
            "disk_tokens_per_run": statistics.mean(r["disk_tokens"] for r in rs),
            "wrong_tokens": wrong,
            "errored_requests": sum(r["errored"] for r in rs),
        }
    return {"workload": dataclasses.asdict(work), "configs": results}


def hostile_rows(model: Path, work: Workload) -> dict[str, Any]:
    """The disk tier on a clean and on a hostile directory (``faults_hostile``), as rows of
    ``configs`` ("time/0%" of the hostile row is against the clean disk row)."""
    from faults_hostile import bench_hostile
    from hybridkv.model.loading.loader import load_model_config

    prompts = make_prompts(load_model_config(str(model)).vocab_size, work)
    llm_kw = {
        "dtype": "float32",
        "block_size": 16,
        "kv_cache_memory": "512MiB",
        "max_num_seqs": work.num_prompts,
        "max_model_len": work.prompt_len + work.output_len + 16,
    }
    out = bench_hostile(model, prompts, work.output_len, work.rounds, llm_kw)
    return {"hostile_startup_s": out["startup_s"], "hostile_configs": out["rows"]}


def hostile_client_rows(model: Path, work: Workload) -> dict[str, Any]:
    """The P/D pair with and without a hostile client (``faults_hostile_client``): 27 honest
    prompts of 32-256 tokens per run, 3 of them followed by an attack."""
    from faults_hostile_client import bench_hostile_client

    rng = random.Random(7)
    count = 9 if work.rounds <= 1 else 27
    prompts = [
        [rng.randrange(FIRST_TOKEN_ID, 1000) for _ in range(rng.randrange(32, 257))]
        for _ in range(count)
    ]
    return {"hostile_client": bench_hostile_client(model, prompts, 8, work.rounds)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny checkpoint, one round (seconds)")
    p.add_argument(
        "--arch", default="granitemoehybrid", choices=("qwen3", "gemma3", "granitemoehybrid")
    )
    p.add_argument("--sizes", default=None, help="comma-separated: tiny,small (default: both)")
    p.add_argument("--rounds", type=int, default=None, help="measured rounds (default 5)")
    p.add_argument("--cache-dir", type=Path, default=None, help="where checkpoints are built")
    p.add_argument(
        "--only-hostile", action="store_true", help="only the disk-tier clean/hostile rows"
    )
    p.add_argument(
        "--only-hostile-client", action="store_true", help="only the P/D hostile-client rows"
    )
    return p.parse_args(argv)


def default_cache_dir() -> Path:
    from hybridkv.paths import cache_dir

    return cache_dir() / "bench-checkpoints"


def print_table(doc: dict[str, Any]) -> None:
    for ckpt, res in doc["results"].items():
        w = res["workload"]
        print(
            f"\n{ckpt}: {w['num_prompts']} prompts x {w['prompt_len']} tokens, "
            f"{w['output_len']} out, {w['rounds']} rounds",
            file=sys.stderr,
        )
        print(
            f"{'config':<13}{'out tok/s':>10}{'TTFT ms':>9}{'time/0%':>9}"
            f"{'failures':>9}{'recomp tok':>11}{'wrong':>7}",
            file=sys.stderr,
        )
        for name, r in {**res["configs"], **res.get("hostile_configs", {})}.items():
            print(
                f"{name:<13}{r['output_tok_s']['median']:>10.1f}{r['ttft_ms']['median']:>9.1f}"
                f"{r['time_vs_0pct']['median']:>9.2f}{r['failures_per_run']:>9.1f}"
                f"{r['recomputed_tokens_per_run']:>11.1f}{r['wrong_tokens']:>7}",
                file=sys.stderr,
            )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workloads = dict(QUICK if args.quick else FULL)
    if args.sizes:
        workloads = {s: FULL.get(s) or QUICK[s] for s in args.sizes.split(",")}
    if args.rounds is not None:
        workloads = {s: dataclasses.replace(w, rounds=args.rounds) for s, w in workloads.items()}
    configs = fault_configs(args.quick)
    cache_dir = args.cache_dir or default_cache_dir()
    doc: dict[str, Any] = {
        "benchmark": "faults",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(cpu_flags=cpu_flags()),
        "quick": args.quick,
        "arch": args.arch,
        "load_mode": "async",
        "policy": "recompute",
        "results": {},
    }
    started = time.perf_counter()
    for size, work in workloads.items():
        model = ensure_checkpoint(cache_dir, args.arch, size)
        if args.only_hostile or args.only_hostile_client:
            result: dict[str, Any] = {"workload": dataclasses.asdict(work), "configs": {}}
        else:
            result = bench_checkpoint(model, work, configs)
        if not args.only_hostile_client:
            result.update(hostile_rows(model, work))
        if size == "tiny" and not args.quick and not args.only_hostile or args.only_hostile_client:
            result.update(hostile_client_rows(model, work))
        doc["results"][f"{args.arch}-{size}"] = result
    doc["seconds"] = time.perf_counter() - started
    rows = [
        c
        for r in doc["results"].values()
        for c in [*r["configs"].values(), *r.get("hostile_configs", {}).values()]
    ]
    clients = [r["hostile_client"] for r in doc["results"].values() if "hostile_client" in r]
    wrong = sum(c["wrong_tokens"] for c in rows)
    wrong_requests = sum(row["wrong_requests"] for c in clients for row in c["rows"].values())
    errored = sum(c["errored_requests"] for c in rows)
    unhealthy = sum(c["attacks_answered_5xx"] + c["decode_health_not_200"] for c in clients)
    doc["wrong_tokens"] = wrong
    doc["errored_requests"] = errored
    print(json.dumps(doc, indent=1))
    print_table(doc)
    if wrong or errored or wrong_requests or unhealthy:
        print(
            f"\nFAIL: {wrong} wrong tokens, {errored} errored requests; hostile client: "
            f"{wrong_requests} wrong honest requests, {unhealthy} 5xx answers or failed health polls",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

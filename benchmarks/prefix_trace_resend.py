"""B1 with prefix caching on, sent twice (issue 29's motivating case): Granite-small, B1's
mixed workload (``throughput_mixed.py``: 32 requests, prompts U[16, 384], outputs U[8, 128],
greedy, ``ignore_eos``, at most 16 running), the whole batch generated once and then again.

Each variant runs in its own subprocess, so different source trees (checkpoint policies) run
on the same machine in the same run, alternating, after one warm-up of each:

    caching off     the branch's engine, prefix caching off (every prompt token computed)
    <label>         prefix caching on, with ``hybridkv`` imported from ``--src LABEL=DIR``

Reported per variant: prompt tokens hit on the second pass (the first hits none), the two
passes' output tokens per second (median over ``--repeats``, after ``--warmup`` rounds) and whether its outputs equal
the caching-off run's.

    .venv/bin/python benchmarks/prefix_trace_resend.py --src value=/path/to/old/src   # ~6 min
    .venv/bin/python benchmarks/prefix_trace_resend.py --quick                        # seconds
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One engine, the batch twice; JSON on stdout."""
    import hybridkv
    from bench_common import ensure_checkpoint
    from throughput_mixed import HybridKV, MixedWorkload, make_requests

    work = MixedWorkload(args.num_requests, (16, args.max_prompt), (8, args.max_output), 16, 1)
    path = ensure_checkpoint(args.cache_dir, "granitemoehybrid", args.size)
    engine = HybridKV(path, "float32", work, prefix_caching=args.caching)
    reqs = make_requests(engine.llm.tokenizer.vocab_size, work)
    stats = engine.llm.engine.kv.stats
    outputs, hits = [], []
    start = time.perf_counter()
    for _ in range(2):
        before = stats.hit_tokens
        outputs += engine.generate(reqs)
        hits.append(stats.hit_tokens - before)
    seconds = time.perf_counter() - start
    engine.llm.close()
    digest = hashlib.sha256(json.dumps(outputs).encode()).hexdigest()[:16]
    return {
        "hybridkv": hybridkv.__file__,
        "hit_tokens": hits,
        "prompt_tokens": sum(len(p) for p in reqs.prompts),
        "output_tok_per_s": 2 * sum(reqs.output_lens) / seconds,
        "seconds": seconds,
        "outputs_sha256": digest,
    }


def run_variant(args: argparse.Namespace, src: Path, caching: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__)), "--worker", "--cache-dir", str(args.cache_dir)]
    cmd += ["--num-requests", str(args.num_requests), "--size", args.size]
    cmd += ["--max-prompt", str(args.max_prompt), "--max-output", str(args.max_output)]
    cmd += ["--caching"] if caching else []
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{HERE}"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if res.returncode:
        raise RuntimeError(f"variant {src} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return {}
    from bench_common import cpu_flags, machine_info

    variants = [("caching off", SRC, False), ("branch", SRC, True)]
    for spec in args.src:
        label, _, path = spec.partition("=")
        variants.append((label, Path(path).resolve(), True))
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in variants}
    for rnd in range(args.warmup + args.repeats):  # warm-ups: the page cache, the compiler
        for label, src, caching in variants:
            r = run_variant(args, src, caching)
            if rnd >= args.warmup:
                runs[label].append(r)
            print(f"{label:12} round {rnd}: {json.dumps(r)}", file=sys.stderr)
    plain = runs["caching off"][0]["outputs_sha256"]
    table = {
        label: {
            "hit_tokens_second_pass": rs[0]["hit_tokens"][1],
            "prompt_tokens": rs[0]["prompt_tokens"],
            "output_tok_per_s": statistics.median(r["output_tok_per_s"] for r in rs),
            "output_tok_per_s_all": [round(r["output_tok_per_s"], 1) for r in rs],
            "outputs_equal_caching_off": all(r["outputs_sha256"] == plain for r in rs),
            "hybridkv": rs[0]["hybridkv"],
        }
        for label, rs in runs.items()
    }
    out = {
        "benchmark": "prefix_trace_resend",
        "machine": machine_info(cpu_flags=cpu_flags(), load_average=os.getloadavg()),
        "workload": vars(args) | {"cache_dir": str(args.cache_dir)},
        "results": table,
    }
    print(json.dumps(out, indent=2, default=str))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--src", nargs="*", default=[], metavar="LABEL=DIR", help="more policies")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=384)
    p.add_argument("--max-output", type=int, default=128)
    p.add_argument("--size", default="small")
    p.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "hybridkv-bench")
    p.add_argument("--quick", action="store_true", help="tiny Granite, 8 short requests, 1 run")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--caching", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.num_requests, args.repeats, args.warmup = "tiny", 8, 1, 0
        args.max_prompt, args.max_output = 48, 12
    return args


if __name__ == "__main__":
    main()

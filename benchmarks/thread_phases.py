"""How many compute threads a step should use: 1 vs 2 vs ``auto`` (``model/step/threads.py``: one
thread for decode steps, every core for prefill steps), per phase.

Builds hybridkv's ``EngineCore`` on a B1 checkpoint and, alternating the thread settings
(the runner's ``StepThreads``, which sizes torch's and the native kernels' OpenMP pool), runs the
same ``--batch`` requests of ``--prompt-len`` random tokens: one prefill step (every prompt at
once), then ``--steps`` decode steps. Per phase and thread count: wall seconds and the
process's CPU seconds (all threads, OpenMP's barrier spinning included), medians over
``--repeats`` rounds. On a quiet machine wall time says which is faster; on a shared one,
CPU time / wall time shows what the second thread costs when it is descheduled.

    .venv/bin/python benchmarks/thread_phases.py --sizes small --archs qwen3_full
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from hybridkv.model.step.threads import StepThreads
from throughput import FIRST_TOKEN_ID, add_case_args, b1_machine, make_llm, run_cases


def one_round(llm: Any, vocab: int, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Wall and CPU seconds of the prefill step and of the decode steps."""
    from hybridkv import SamplingParams

    rng = random.Random(seed)
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 1, ignore_eos=True)
    for _ in range(args.batch):
        llm.engine.add_request(
            [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(args.prompt_len)], params
        )
    times: dict[str, list[float]] = {"prefill": [0.0, 0.0], "decode": [0.0, 0.0]}
    first = True
    while llm.engine.has_unfinished_requests():
        wall, cpu = time.perf_counter(), time.process_time()
        llm.engine.step()
        phase = times["prefill" if first else "decode"]
        phase[0] += time.perf_counter() - wall
        phase[1] += time.process_time() - cpu
        first = False
    return {f"{p}_{k}": v[i] for p, v in times.items() for i, k in enumerate(("wall_s", "cpu_s"))}


def compare(path: Path, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    llm = make_llm(path, dtype, max_num_seqs=args.batch, max_num_batched_tokens=8192)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in args.counts}
    cores = os.cpu_count() or 1
    for rnd in range(args.repeats + 1):  # round 0 warms up
        for n in args.counts:
            fixed = None if n == "auto" else int(n)
            llm.engine.runner.threads = StepThreads(fixed or cores, fixed=fixed)
            result = one_round(llm, vocab, args, seed=rnd)
            if rnd:
                runs[n].append(result)
    out: dict[str, Any] = {}
    for n, rounds in runs.items():
        out[f"threads_{n}"] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        row = out[f"threads_{n}"]
        print(
            f"  threads {n}: prefill {row['prefill_wall_s']:.3f} s wall / {row['prefill_cpu_s']:.3f}"
            f" s CPU; decode {row['decode_wall_s']:.3f} s wall / {row['decode_cpu_s']:.3f} s CPU",
            file=sys.stderr,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="qwen3 tiny, 4 short requests")
    add_case_args(p, dtypes=["float32"])
    p.add_argument("--counts", nargs="+", default=["1", "2", "auto"], help="thread counts, or auto")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=32)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.archs, args.batch, args.prompt_len = ["tiny"], ["qwen3"], 4, 16
        args.steps, args.repeats = 4, 1
    if any(n != "auto" and (not n.isdigit() or int(n) < 1) for n in args.counts):
        p.error("--counts takes positive integers and auto")
    results = run_cases(args, lambda path, dtype: compare(path, dtype, args))
    print(json.dumps({"benchmark": "thread_phases", "machine": b1_machine(), "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

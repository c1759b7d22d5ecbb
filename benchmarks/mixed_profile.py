"""Where B1's mixed workload spends its time: every engine step of ``throughput_mixed.py``'s
workload, split by part (``step_profile.py``'s timers, wall clock) and summed by step kind.

- ``decode``: steps where every scheduled request computes one token;
- ``mixed``: steps that compute prompt tokens too (chunked prefills, with decodes alongside).

For each kind: the number of steps and tokens, and seconds per part (schedule, build_step,
gemm, attention, forward other, sampler, update, engine other). The workload is the same as
``throughput_mixed.py``'s (same seed, same engine limits); the first of two rounds warms up.
Wall clock, so that a step's parallel parts count once: run it on a quiet machine.

    .venv/bin/python benchmarks/mixed_profile.py --sizes small --archs qwen3_full gemma3
    .venv/bin/python benchmarks/mixed_profile.py --quick     # seconds; run by the tests

``--gguf FILE...`` profiles those model files (llama.cpp's GGUF, B1 against llama.cpp: 32
requests at once) instead of the B1 checkpoints; ``--clock cpu`` times on the thread's CPU
clock (one thread, loaded machine); ``--gemms`` adds a table of GEMM time by weight format,
path and rows (``gemm_table.py``):

    .venv/bin/python benchmarks/mixed_profile.py --threads 1 --clock cpu --concurrency 32 \
        --gemms --gguf /work/llamacpp/models/granitemoehybrid-small-q4_k_m.gguf
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from gemm_table import GemmTable, gemms_timed
from step_profile import Timers, instrumented, split
from throughput import add_case_args, b1_machine, make_llm, run_cases
from throughput_mixed import MixedWorkload, make_requests


def profile_case(
    path: Path, dtype: str, work: MixedWorkload, args: argparse.Namespace
) -> dict[str, Any]:
    from hybridkv import SamplingParams
    from hybridkv.model.loading.hub import resolve_model_dir

    vocab = json.loads((resolve_model_dir(str(path)) / "config.json").read_text())["vocab_size"]
    reqs = make_requests(vocab, work)
    llm = make_llm(path, dtype, max_num_seqs=work.concurrency, max_num_batched_tokens=2048,
                   max_model_len=work.prompt_range[1] + work.output_range[1] + 16)  # fmt: skip
    engine, kinds = llm.engine, {}
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    for rnd in range(2):  # round 0 warms up
        for prompt, n in zip(reqs.prompts, reqs.output_lens, strict=True):
            engine.add_request(
                prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
            )
        table = GemmTable(clock)
        began = clock()
        with gemms_timed(table) if args.gemms and rnd else nullcontext():
            kinds = profile_steps(llm, clock)
        total = clock() - began
    result = {"seconds": total, "tokens_per_s": reqs.num_tokens / total, "kinds": kinds}
    return result | ({"gemms": table.rows()} if args.gemms else {})


def profile_steps(llm: Any, clock: Callable[[], float]) -> dict[str, dict[str, float]]:
    """Run the engine to the end; seconds per part, summed per step kind."""
    engine, timers = llm.engine, Timers(clock)
    kinds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    scheduled: list[Any] = []
    schedule = engine.scheduler.schedule

    def remembered(*args: Any, **kwargs: Any) -> Any:
        scheduled.append(out := schedule(*args, **kwargs))
        return out

    engine.scheduler.schedule = remembered
    try:
        with instrumented(llm, timers):
            while engine.has_unfinished_requests():
                timers.seconds.clear()
                began = clock()
                engine.step()
                ms = split(clock() - began, timers.seconds)
                out = scheduled.pop()
                kind = kinds["decode" if out.num_scheduled_tokens == len(out.requests) else "mixed"]
                kind["steps"] += 1
                kind["tokens"] += out.num_scheduled_tokens
                for part, value in ms.items():
                    kind[f"{part}_s"] += value / 1e3
    finally:
        engine.scheduler.schedule = schedule
    return {name: dict(parts) for name, parts in kinds.items()}


def print_case(case: str, result: dict[str, Any]) -> None:
    print(f"{case}: {result['seconds']:.2f} s, {result['tokens_per_s']:.0f} tok/s", file=sys.stderr)
    for name, parts in result["kinds"].items():
        cells = ", ".join(f"{k} {v:.3g}" for k, v in parts.items())
        print(f"  {name}: {cells}", file=sys.stderr)
    for row in result.get("gemms", [])[:24]:
        print(f"  {row['gemm']:<22} rows {row['rows']:<10} calls {row['calls']:>6} "
              f"{row['s']:8.3f} s", file=sys.stderr)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="qwen3 tiny, 6 short requests")
    add_case_args(p, dtypes=["float32"])
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--gguf", nargs="+", type=Path, default=[], help="model files to profile")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    p.add_argument("--gemms", action="store_true", help="GEMM time by format, path and rows")
    args = p.parse_args(argv)
    prompts, outputs = (16, 384), (8, 128)
    if args.quick:
        args.sizes, args.archs, args.num_requests, args.concurrency = ["tiny"], ["qwen3"], 6, 4
        prompts, outputs = (8, 48), (2, 8)
    work = MixedWorkload(args.num_requests, prompts, outputs, args.concurrency, repeats=1)
    torch.set_num_threads(args.threads)
    if args.gguf:
        results = {f.name: profile_case(f, "float32", work, args) for f in args.gguf}
    else:
        results = run_cases(args, lambda path, dtype: profile_case(path, dtype, work, args))
    for case, result in results.items():
        print_case(case, result)
    doc = {"benchmark": "mixed_profile", "machine": b1_machine(), "results": results}
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

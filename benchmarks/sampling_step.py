"""Decode step time with and without sampling options (issue 15).

A batch of ``--batch`` requests decodes ``--tokens`` tokens each (eos ignored) on a tiny
checkpoint; every engine step after the prefill is timed and the median reported, for plain
greedy requests (the fast path: no logits processor runs) and, unless ``--plain-only``, for
requests with penalties + logit_bias + min_p (sampled, seeded). Runs on any hybridkv tree
(``PYTHONPATH=<tree>/src``): with ``--plain-only`` it uses only APIs older than issue 15,
so the same command measures the step before and after.

    PYTHONPATH=src .venv/bin/python benchmarks/sampling_step.py
    PYTHONPATH=/old/tree/src .venv/bin/python benchmarks/sampling_step.py --plain-only
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import machine_info


def step_times(model: Path, batch: int, tokens: int, params: Any) -> list[float]:
    from hybridkv.config import EngineConfig
    from hybridkv.engine.core import EngineCore

    config = EngineConfig.create(str(model), kv_cache_memory="256MiB", max_num_seqs=batch)
    engine = EngineCore(config)
    for i in range(batch):
        engine.add_request([5 + i, 6, 7, 8, 9, 10, 11, 12], params)
    engine.step()  # the prefill
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return times


def sampler_time(batch: int, params: Any, vocab: int = 32000, iters: int = 200) -> float:
    """The sampler alone on ``[batch, vocab]`` logits: the fastest of ``iters`` calls (the
    minimum is what a loaded machine disturbs least)."""
    import torch

    from hybridkv.model.sampling.sampler import Sampler, SampleRequest

    sampler = Sampler(0)
    logits = torch.randn(batch, vocab)
    reqs = [SampleRequest(f"r{i}", params, 5) for i in range(batch)]
    best = float("inf")
    for _ in range(iters):
        start = time.perf_counter()
        sampler.sample(logits, reqs)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plain-only", action="store_true")
    args = parser.parse_args()
    from hybridkv import SamplingParams
    from hybridkv.model.loading.make_model import ensure_model
    from hybridkv.paths import cache_dir

    model = cache_dir() / "bench-checkpoints" / "qwen3-tiny"
    ensure_model("qwen3", model, size="tiny", seed=0)
    cases: dict[str, Any] = {
        "greedy": SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    }
    if not args.plain_only:
        cases["options"] = SamplingParams(
            temperature=0.8, seed=1, max_tokens=args.tokens, ignore_eos=True, min_p=0.05,
            presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1,
            logit_bias={5: 1.0},
        )  # fmt: skip
    results: dict[str, Any] = {}
    for name, params in cases.items():
        runs = [step_times(model, args.batch, args.tokens, params) for _ in range(args.repeats)]
        results[name] = {
            "median_step_ms": round(1000 * min(statistics.median(r) for r in runs), 3),
            "min_step_ms": round(1000 * min(min(r) for r in runs), 3),
            "sampler_min_us": round(1e6 * sampler_time(args.batch, params), 1),
        }
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0]
    avx = sorted({f for f in flags.split() if f.startswith(("avx", "amx", "fma"))})
    print(json.dumps({"batch": args.batch, "tokens": args.tokens, "results": results,
                      "uptime": load, "cpu_flags": avx, "machine": machine_info()},
                     indent=1))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

"""One decode step's MoE experts with gpt-oss's MXFP4 weights (``native/mxfp4.c``) against the
float32 skinny GEMM (``native/gemm.c``, hybridkv's float32 decode path), on a gpt-oss-20b
sized-down expert set (hidden and intermediate 1440, half of gpt-oss-20b's 2880; the 4 experts
a token routes to per layer: gate|up ``[2880, 1440]`` and down ``[1440, 1440]``), and the
weight-read floor: the step's weight bytes / this machine's read bandwidth, measured in the
same run (``quant_decode.read_bandwidth``).

Every expert is a distinct tensor, and before each timed pass an eviction buffer larger than
the L3 (``--evict-mib``) is read, so the weights come from memory as in a real model (whose
experts never fit a cache). One thread: CPU time of the calling thread; two threads: wall time
(meaningful on a quiet machine: the load average is printed). Best of ``--repeats``.

    PYTHONPATH=src .venv/bin/python benchmarks/mxfp4_decode.py             # ~1 min
    PYTHONPATH=src .venv/bin/python benchmarks/mxfp4_decode.py --quick     # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench_common import cpu_flags, machine_info
from hybridkv.native.gemm import load_gemm
from hybridkv.native.mxfp4 import load_mxfp4
from quant_decode import read_bandwidth

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' own MXFP4 packer
from tests.support.hub_pack import pack_mxfp4  # noqa: E402

HIDDEN, INNER, EXPERTS_PER_TOKEN = 1440, 1440, 4
Weights = list[tuple[torch.Tensor, ...]]  # float32: (w,); MXFP4: (blocks, scales)


def make_weights(layers: int) -> dict[str, Weights]:
    """Per active expert: gate|up and down, float32 and the same in MXFP4."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(2 * INNER, HIDDEN), (HIDDEN, INNER)] * (layers * EXPERTS_PER_TOKEN)
    floats = [torch.randn(n, k, generator=gen) * 0.05 for n, k in shapes]
    return {"float32": [(w,) for w in floats], "mxfp4": [pack_mxfp4(w) for w in floats]}


def step_seconds(run: Callable[..., torch.Tensor], weights: Weights, rows: int, repeats: int,
                 clock: Callable[[], float], evict: torch.Tensor) -> float:  # fmt: skip
    inputs = {k: torch.randn(rows, k) for k in (HIDDEN, INNER)}
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms up
        torch.sum(evict)  # the weights out of the caches
        start = clock()
        for i, w in enumerate(weights):
            run(inputs[HIDDEN if i % 2 == 0 else INNER], *w)
        best = min(best, clock() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--evict-mib", type=int, default=768)
    parser.add_argument("--quick", action="store_true", help="1 layer, 1 row, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.threads, args.repeats, args.layers, args.evict_mib = [1], [1], 1, 1, 64
    gemm, mxfp4 = load_gemm(), load_mxfp4()
    if gemm is None or mxfp4 is None:
        raise SystemExit("native kernels unavailable (no compiler?)")
    weights = make_weights(args.layers)
    runs = {"float32": gemm.linear, "mxfp4": mxfp4.linear}
    step_bytes = {
        name: sum(t.numel() * t.element_size() for w in ws for t in w)
        for name, ws in weights.items()
    }
    evict = torch.ones(args.evict_mib * (1 << 20) // 4)
    results = []
    for threads in args.threads:
        bandwidth = read_bandwidth(threads, args.repeats, 64 if args.quick else 512)
        torch.set_num_threads(threads)
        clock = time.thread_time if threads == 1 else time.perf_counter
        for rows in args.rows:
            for name, run in runs.items():
                secs = step_seconds(run, weights[name], rows, args.repeats, clock, evict)
                floor = step_bytes[name] / bandwidth
                results.append({
                    "threads": threads, "rows": rows, "weights": name, "step_ms": secs * 1e3,
                    "weight_mb": step_bytes[name] / 1e6, "floor_ms": floor * 1e3,
                    "x_floor": secs / floor, "read_gb_s": bandwidth / 1e9,
                })  # fmt: skip
    report = {
        "benchmark": "mxfp4_decode",
        "layers": args.layers,
        "experts_per_token": EXPERTS_PER_TOKEN,
        "results": results,
        "machine": machine_info(load_average=os.getloadavg(), cpu_flags=cpu_flags()),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

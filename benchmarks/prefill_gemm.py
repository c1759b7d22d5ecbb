"""The GEMMs of prefill / mixed steps (rows above ``SKINNY_MAX_ROWS``): ``F.linear`` (MKL sgemm,
which repacks the weight at every call) against the two prepacked paths torch offers, on the
small checkpoints' projection shapes (one step's distinct weights: ``skinny_gemm.step_weights``,
qwen3_full-small and gemma3-small share them):

- ``mkl_packed``: ``torch.ops.mkl._mkl_reorder_linear_weight`` once (packed at 2,048 rows;
  MKL's packed B layout does not depend on the row count, see ``packed_layout_rows_free``) and
  ``torch.ops.mkl._mkl_linear`` with the call's own row count;
- ``dnn_packed``: oneDNN, ``torch.ops.mkldnn._reorder_linear_weight(w, 2048)`` once and
  ``torch.ops.mkldnn._linear_pointwise``.

The variants alternate within one process (one pass each, round-robin), so load changes hit
them alike; the median pass is reported. One thread: CPU time of the thread. Two threads: CPU
time of the process and wall time (wall only means something on a quiet machine; the load
average is printed). Also the float32 peak of the CPU: a square 2,048 sgemm.

    PYTHONPATH=src .venv/bin/python benchmarks/prefill_gemm.py                 # ~3 min idle
    PYTHONPATH=src .venv/bin/python benchmarks/prefill_gemm.py --threads 1 --rows 365
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bench_common import cpu_flags, machine_info
from skinny_gemm import LAYER_SHAPES

Gemm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
PACK_ROWS = 2048
# rows of B1's mixed steps (throughput_mixed.py's workload: 48 requests, prompts U[16, 384],
# outputs U[8, 128], 16 at a time, 2,048-token budget), in order; 265 decode steps besides
B1_MIX = [2048, 855, 154, 53, 52, 291, 204, 168, 525, 288, 132, 266, 332, 323, 60, 83, 372]
B1_MIX += [269, 381, 262, 46, 133, 221, 388, 349, 38, 95, 112, 237, 91, 324, 212, 267]


def contenders(weights: list[torch.Tensor]) -> dict[str, Gemm]:
    """Each variant as ``gemm(x, w)`` over ``weights`` (packed copies made here, once)."""
    found: dict[str, Gemm] = {"f_linear": lambda x, w: F.linear(x, w)}
    if torch.backends.mkl.is_available():
        mkl = {id(w): torch.ops.mkl._mkl_reorder_linear_weight(w, PACK_ROWS) for w in weights}
        found["mkl_packed"] = lambda x, w: torch.ops.mkl._mkl_linear(
            x, mkl[id(w)], w, None, x.shape[0]
        )
    if torch.backends.mkldnn.is_available():
        dnn = {id(w): torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) for w in weights}
        found["dnn_packed"] = lambda x, w: torch.ops.mkldnn._linear_pointwise(
            x, dnn[id(w)], None, "none", [], ""
        )
    return found


def time_variants(
    gemms: dict[str, Gemm], weights: list[torch.Tensor], rows: list[int], args: argparse.Namespace
) -> dict[str, float]:
    """Median seconds of one pass over every weight at each of ``rows`` (summed), per variant
    and clock; the variants alternate pass by pass."""
    inputs = [{k: torch.randn(m, k) for k in {w.shape[1] for w in weights}} for m in rows]
    clocks: dict[str, Callable[[], float]] = (
        {"cpu": time.thread_time}
        if torch.get_num_threads() == 1
        else {"cpu": time.process_time, "wall": time.perf_counter}
    )
    samples: dict[str, list[float]] = {}
    for rep in range(args.repeats + 1):  # pass 0 warms up
        for name, gemm in gemms.items():
            start = {c: clock() for c, clock in clocks.items()}
            for xs in inputs:
                for w in weights:
                    gemm(xs[w.shape[1]], w)
            if rep:
                for c, clock in clocks.items():
                    samples.setdefault(f"{name}_{c}_s", []).append(clock() - start[c])
    return {key: sorted(v)[len(v) // 2] for key, v in samples.items()}


def case(
    gemms: dict[str, Gemm], weights: list[torch.Tensor], rows: list[int], args: argparse.Namespace
) -> dict[str, float]:
    """One row count (or the B1 mix): seconds per variant and clock, speed-ups over F.linear
    and GFLOP/s (CPU time; on two threads as if both ran all along)."""
    result = time_variants(gemms, weights, rows, args)
    flops = sum(2 * m * w.numel() for m in rows for w in weights)
    threads = torch.get_num_threads()
    for key, seconds in list(result.items()):
        clock = key.rsplit("_", 2)[-2]
        result[key.replace("_s", "_speedup")] = result[f"f_linear_{clock}_s"] / seconds
        if clock == "cpu":
            result[key.replace("_cpu_s", "_gflops")] = flops / seconds * threads / 1e9
    return result


def peak_gflops(size: int = 2048, repeats: int = 3) -> float:
    """float32 GFLOP/s of a square sgemm, from CPU time (on two threads: as if both ran all
    along)."""
    threads = torch.get_num_threads()
    a, b = torch.randn(size, size), torch.randn(size, size)
    clock = time.thread_time if threads == 1 else time.process_time
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        torch.mm(a, b)
        best = min(best, clock() - start)
    return 2 * size**3 / best * threads / 1e9


def packed_layout_rows_free(weight: torch.Tensor, rows: list[int]) -> bool:
    """Whether MKL's weight packed at ``PACK_ROWS`` rows gives, at each of ``rows``, bitwise
    the product of a weight packed at that row count."""
    packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_ROWS)
    for m in rows:
        x = torch.randn(m, weight.shape[1])
        own = torch.ops.mkl._mkl_reorder_linear_weight(weight, m)
        a = torch.ops.mkl._mkl_linear(x, packed, weight, None, m)
        if not torch.equal(a, torch.ops.mkl._mkl_linear(x, own, weight, None, m)):
            return False
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one layer, 64 rows, one thread")
    p.add_argument("--rows", type=int, nargs="+", default=[64, 128, 256, 365, 1024])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--layers", type=int, default=4, help="distinct layers of weights (4: 100 MB)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-mix", action="store_true", help="skip the B1 mixed steps' row mix")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.threads, args.layers, args.repeats, args.no_mix = [64], [1], 1, 1, True
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) for n, k in LAYER_SHAPES * args.layers]
    report: dict[str, Any] = {
        "benchmark": "prefill_gemm",
        "machine": machine_info(cpu_flags=cpu_flags(), load=os.getloadavg()),
        "layers": args.layers,
        "pack_rows": PACK_ROWS,
        "results": {},
    }
    with torch.inference_mode():
        gemms = contenders(weights)
        if "mkl_packed" in gemms:
            report["mkl_layout_rows_free"] = packed_layout_rows_free(weights[0], [49, 365, 2048])
        for threads in args.threads:
            torch.set_num_threads(threads)
            cases = {str(m): [m] for m in args.rows} | ({} if args.no_mix else {"b1_mix": B1_MIX})
            report["results"][f"threads_{threads}"] = found = {"peak_gflops": peak_gflops()}
            for name, rows in cases.items():
                found[name] = case(gemms, weights, rows, args)
                cells = {k: round(v, 3) for k, v in found[name].items() if "speedup" in k}
                print(f"threads {threads} rows {name}: {cells}", file=sys.stderr, flush=True)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One decode step's projections with block-quantized weights (``native/quant.c``: Q8_0, Q4_K)
against the float32 skinny GEMM (``native/gemm.c``, hybridkv's float32 decode path), on a
Granite-4.0-H-small-sized projection set (granitemoehybrid-small: 9 Mamba2 layers' in/out
projections, 3 attention layers' qkv/o, 12 shared MLPs, the lm_head), and the weight-read
floor: the step's weight bytes / this machine's read bandwidth, measured in the same run
(``torch.sum`` of a 512 MiB float32 tensor on the step's threads and clock).

Weights are distinct tensors, and before every timed pass a 512 MiB tensor is summed, so the
weights come from memory, not from a (large, shared) L3. The read bandwidth of the floor is
the faster of that ``torch.sum`` and the float32 step at one row (its 383 MB of weights, also
cold): no kernel reads faster than memory delivers. Columns: float32 (``gemm.c``), Q8_0 /
Q4_K / Q6_K with float32 activations, ``int8``: the int8-activation path (``quant_int8.h``,
what decode runs for Q4_K / Q6_K), ``panels``: past ``QUANT_MAX_ROWS`` rows, the prefill path
(dequantized panels + ``F.linear``). One thread: CPU time of the calling thread
(``time.thread_time``, meaningful under load); two threads: wall time (only meaningful on a
quiet machine: the load average is printed). Best of ``--repeats``.

    PYTHONPATH=src .venv/bin/python benchmarks/quant_decode.py                # ~2 min
    PYTHONPATH=src .venv/bin/python benchmarks/quant_decode.py --rows 1 --threads 1
    PYTHONPATH=src .venv/bin/python benchmarks/quant_decode.py --quick        # seconds
    PYTHONPATH=src .venv/bin/python benchmarks/quant_decode.py --rows 64 128 --threads 1  # prefill
    PYTHONPATH=src .venv/bin/python benchmarks/quant_decode.py --rows 1 --threads 1 \\
        --baseline-src /work/main/src --only "Q8_0 int8" "Q8_0 int8 base"   # before / after
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench_common import cpu_flags, machine_info
from hybridkv.model.layers.quant_linear import QUANT_MAX_ROWS, linear_by_panels
from hybridkv.native import load_library
from hybridkv.native.gemm import load_gemm
from hybridkv.native.quant import QuantGemm, load_quant
from hybridkv.native.quant_blocks import QuantFormat, pack

# (N, K) of granitemoehybrid-small (hidden 768, 12 layers: mamba x3 : attention x1)
MAMBA = [(2 * 1536 + 2 * 64 + 24, 768), (768, 1536)]  # in_proj (z|xBC|dt), out_proj
ATTENTION = [(1280, 768), (768, 768)]  # q|k|v (12 + 4 + 4 heads of 64), o
MLP = [(4096, 768), (768, 2048)]  # shared MLP: gate|up, down
HEAD = (2048, 768)


def step_shapes(layers: int) -> list[tuple[int, int]]:
    shapes: list[tuple[int, int]] = []
    for i in range(layers):
        shapes += (ATTENTION if i % 4 == 3 else MAMBA) + MLP
    return [*shapes, HEAD]


def make_weights(shapes: list[tuple[int, int]]) -> dict[str, list[torch.Tensor]]:
    """float32 weights and the same packed Q8_0 / Q4_K (uint8 rows)."""
    gen = np.random.default_rng(0)
    floats = [(gen.standard_normal((n, k), dtype=np.float32) * 0.05) for n, k in shapes]
    out = {"float32": [torch.from_numpy(w) for w in floats]}
    for fmt in QuantFormat:
        out[fmt.name] = [torch.from_numpy(pack(w, fmt)) for w in floats]
    return out


def step_seconds(run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 weights: list[torch.Tensor], ks: list[int], rows: int, repeats: int,
                 clock: Callable[[], float], evict: torch.Tensor) -> tuple[float, float]:  # fmt: skip
    """The best step time, and the median of each pass's time x the read bandwidth of the
    evicting ``torch.sum`` just before it (the pass's own floor, same moment: on a shared
    machine the bandwidth moves between passes) / the step's weight bytes."""
    inputs = {k: torch.randn(rows, k) for k in set(ks)}
    step_bytes = sum(w.numel() * w.element_size() for w in weights)
    best, paired = float("inf"), []
    for r in range(repeats + 1):  # the first pass warms up
        start = clock()
        evict.sum()  # the weights out of the caches
        mid = clock()
        for w, k in zip(weights, ks, strict=True):
            run(inputs[k], w)
        secs = clock() - mid
        best = min(best, secs)
        if r:
            paired.append(secs * evict.numel() * evict.element_size() / (mid - start) / step_bytes)
    return best, float(np.median(paired))


def read_bandwidth(threads: int, repeats: int, mib: int) -> float:
    """Bytes per second ``threads`` threads read: ``torch.sum`` of a float32 tensor on the
    same clock as the step (one thread: its CPU time; two: wall time)."""
    data = torch.ones(mib * (1 << 20) // 4)
    torch.set_num_threads(threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    best = float("inf")
    for _ in range(repeats + 1):
        start = clock()
        torch.sum(data)
        best = min(best, clock() - start)
    return data.numel() * 4 / best


Run = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def quant_runs(quant: QuantGemm, suffix: str = "") -> dict[str, Run]:
    """The kernel's columns: each format with float32 and with int8 activations."""
    out: dict[str, Run] = {}
    for fmt in QuantFormat:
        for int8 in (False, True):
            name = f"{fmt.name}{' int8' if int8 else ''}{suffix}"
            out[name] = functools.partial(quant.linear, fmt=fmt, int8_activations=int8)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="2 layers, 1 row, 1 repeat")
    parser.add_argument("--only", nargs="+", help="these columns only (e.g. 'Q4_K int8')")
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="also the kernels of another src tree (columns '... base')")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.rows, args.threads, args.repeats, args.layers = [1], [1], 1, 2
    gemm, quant = load_gemm(), load_quant()
    if gemm is None or quant is None:
        raise SystemExit("native kernels unavailable (no compiler?)")
    shapes = step_shapes(args.layers)
    ks = [k for _, k in shapes]
    weights = make_weights(shapes)
    runs: dict[str, Run] = {"float32": gemm.linear, **quant_runs(quant)}
    runs["Q4_K panels"] = lambda x, w: linear_by_panels(x, w, QuantFormat.Q4_K, None, quant)
    if args.baseline_src is not None:
        source = args.baseline_src / "hybridkv" / "native" / "quant.c"
        base = load_library(source, "baseline quantized GEMM", "no baseline")
        if base is None:
            raise SystemExit(f"cannot build {source}")
        runs.update(quant_runs(QuantGemm(base), " base"))
    step_bytes = {
        name: sum(w.numel() * w.element_size() for w in ws) for name, ws in weights.items()
    }
    evict = torch.ones((64 if args.quick else 512) * (1 << 20) // 4)
    results = []
    for threads in args.threads:
        sum_bandwidth = read_bandwidth(threads, args.repeats, 64 if args.quick else 512)
        torch.set_num_threads(threads)
        clock = time.thread_time if threads == 1 else time.perf_counter
        probe, _ = step_seconds(gemm.linear, weights["float32"], ks, 1, args.repeats, clock, evict)
        bandwidth = max(sum_bandwidth, step_bytes["float32"] / probe)
        for rows in args.rows:
            for name, run in runs.items():
                if name.endswith("panels") and rows <= QUANT_MAX_ROWS:
                    continue  # decode steps never take the panels
                if args.only and name not in args.only:
                    continue
                weight_name = name.split()[0]
                secs, paired = step_seconds(
                    run, weights[weight_name], ks, rows, args.repeats, clock, evict
                )
                floor = step_bytes[weight_name] / bandwidth
                results.append({
                    "threads": threads, "rows": rows, "weights": name, "step_ms": secs * 1e3,
                    "weight_mb": step_bytes[weight_name] / 1e6, "floor_ms": floor * 1e3,
                    "x_floor": secs / floor, "x_paired_floor": paired,
                    "read_gb_s": bandwidth / 1e9,
                    "sum_read_gb_s": sum_bandwidth / 1e9,
                })  # fmt: skip
    report = {
        "benchmark": "quant_decode",
        "layers": args.layers,
        "results": results,
        "machine": machine_info(load_average=os.getloadavg(), cpu_flags=cpu_flags()),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

"""Prefill-sized GEMMs with block-quantized weights (Q4_K, Q6_K; ``native/quant_int8.h``):
the tiled int8 kernel (``quant_tiled.h``, what calls of ``I8_TILE_ROWS`` rows or more take)
against the per-row int8 kernel (the same rows in calls of ``PER_ROW`` rows, below the tile
threshold: bitwise the same result) and the dequantized panels + ``F.linear`` (MKL sgemm;
``quant_linear.linear_by_panels``), on four Granite-small layers' projection shapes
(``skinny_gemm.LAYER_SHAPES``, distinct weights). The variants alternate pass by pass in one
process (load changes hit them alike); the median pass is reported, CPU time of the calling
thread on one thread (``time.thread_time``). The CPU flags are printed with the result.

    PYTHONPATH=src .venv/bin/python benchmarks/quant_prefill.py                   # ~2 min
    PYTHONPATH=src .venv/bin/python benchmarks/quant_prefill.py --rows 8 16 --repeats 5
    PYTHONPATH=src .venv/bin/python benchmarks/quant_prefill.py --quick           # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bench_common import cpu_flags, machine_info
from hybridkv.model.layers.quant_linear import linear_by_panels
from hybridkv.native.quant import QuantGemm, load_quant
from hybridkv.native.quant_blocks import QuantFormat, pack
from skinny_gemm import LAYER_SHAPES

PER_ROW = 3  # rows per call of the per-row variant (below I8_TILE_ROWS, 4)
Gemm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def variants(kernel: QuantGemm, fmt: QuantFormat) -> dict[str, Gemm]:
    """``gemm(x, packed weight)`` per variant."""

    def per_row(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        parts = [
            kernel.linear(x[r : r + PER_ROW], w, fmt, None, True) for r in range(0, len(x), PER_ROW)
        ]
        return torch.cat(parts)

    return {
        "tiled": lambda x, w: kernel.linear(x, w, fmt, None, True),
        "per_row": per_row,
        "panels": lambda x, w: linear_by_panels(x, w, fmt, None, kernel),
    }


def time_case(
    gemms: dict[str, Gemm], weights: list[tuple[torch.Tensor, int]], rows: int, repeats: int
) -> dict[str, float]:
    """Median milliseconds of one pass over ``weights`` at ``rows`` rows, per variant (the
    variants alternate), and each one's speed-up over the panels."""
    inputs = {k: torch.randn(rows, k) for k in {s[1] for s in LAYER_SHAPES}}
    samples: dict[str, list[float]] = {name: [] for name in gemms}
    for rep in range(repeats + 1):  # pass 0 warms up
        for name, gemm in gemms.items():
            start = time.thread_time()
            for w, k in weights:
                gemm(inputs[k], w)
            if rep:
                samples[name].append(time.thread_time() - start)
    found = {f"{n}_ms": sorted(v)[len(v) // 2] * 1e3 for n, v in samples.items()}
    for name in gemms:
        found[f"{name}_speedup_vs_panels"] = found["panels_ms"] / found[f"{name}_ms"]
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256, 512])
    p.add_argument("--formats", nargs="+", default=["Q4_K", "Q6_K"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="one layer, 64 rows, one repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.layers, args.repeats = [64], 1, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    kernel = load_quant()
    if kernel is None:
        print("no native quantized GEMM here", file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    report: dict[str, Any] = {
        "benchmark": "quant_prefill",
        "machine": machine_info(cpu_flags=cpu_flags(), load=os.getloadavg()),
        "threads": 1,
        "layers": args.layers,
        "results": {},
    }
    with torch.inference_mode():
        for name in args.formats:
            fmt = QuantFormat[name]
            shapes = LAYER_SHAPES * args.layers
            weights = [
                (
                    torch.from_numpy(pack(rng.standard_normal(s).astype(np.float32) * 0.05, fmt)),
                    s[1],
                )
                for s in shapes
            ]
            gemms = variants(kernel, fmt)
            for rows in args.rows:
                cell = time_case(gemms, weights, rows, args.repeats)
                report["results"][f"{name}_{rows}"] = cell
                print(
                    f"{name} rows {rows}: {json.dumps({k: round(v, 2) for k, v in cell.items()})}",
                    file=sys.stderr,
                    flush=True,
                )
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

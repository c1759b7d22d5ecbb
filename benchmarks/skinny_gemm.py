"""The skinny GEMM kernel (``native/gemm.c``) against ``F.linear`` (MKL sgemm) and MKL's packed
sgemm at decode row counts, on the small checkpoints' projection shapes (qwen3_full-small: one
layer's qkv, o, gate_up, down and the lm_head; times are summed over those five weights times
the layer count, i.e. one decode step's GEMMs).

One thread: CPU time of the calling thread (``time.thread_time``), meaningful under load.
Two threads: wall time (only meaningful on a quiet machine; the load average is printed).

    PYTHONPATH=src .venv/bin/python benchmarks/skinny_gemm.py              # ~1 min
    PYTHONPATH=src .venv/bin/python benchmarks/skinny_gemm.py --threads 1 --rows 1 16
    PYTHONPATH=src .venv/bin/python benchmarks/skinny_gemm.py --isa avx2 --only skinny
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hybridkv.native.gemm import load_gemm

# (N, K) of qwen3_full-small: qkv, o, gate_up, down per layer (x LAYERS) and the lm_head
LAYER_SHAPES = [(1280, 768), (768, 768), (4096, 768), (768, 2048)]
HEAD_SHAPE = (2048, 768)
LAYERS = 12


def step_weights() -> list[torch.Tensor]:
    """Distinct weights (so none is warm in L3 from the previous call), one decode step's."""
    gen = torch.Generator().manual_seed(0)
    shapes = LAYER_SHAPES * LAYERS + [HEAD_SHAPE]
    return [torch.randn(n, k, generator=gen) * 0.05 for n, k in shapes]


def time_step(
    gemm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    weights: list[torch.Tensor],
    rows: int,
    repeats: int,
    clock: Callable[[], float],
) -> float:
    """Best over ``repeats`` of one pass over every weight, seconds."""
    inputs = {k: torch.randn(rows, k) for k in {w.shape[1] for w in weights}}
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms up (packs, builds)
        start = clock()
        for w in weights:
            gemm(inputs[w.shape[1]], w)
        best = min(best, clock() - start)
    return best


def contenders(isa: str | None) -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    kernel = load_gemm(isa)
    packs: dict[int, torch.Tensor] = {}

    def packed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """MKL's packed sgemm (serial; hybridkv used it on one-thread pools until this kernel)."""
        if id(w) not in packs:
            packs[id(w)] = torch.ops.mkl._mkl_reorder_linear_weight(w, 2048)
        out: torch.Tensor = torch.ops.mkl._mkl_linear(x, packs[id(w)], w, None, x.shape[0])
        return out

    found: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "f_linear": lambda x, w: F.linear(x, w),
        "packed": packed,
    }
    if kernel is not None:
        found["skinny"] = kernel.linear
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 12, 16, 24, 32])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--isa", help="the kernel's instruction-set variant (default: native)")
    parser.add_argument("--only", nargs="+", help="contenders to time (f_linear packed skinny)")
    args = parser.parse_args()
    flags = subprocess.run(
        "grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u",
        shell=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    print(json.dumps({"load": os.getloadavg(), "cpu_flags": flags, "isa": args.isa or "native"}))
    weights = step_weights()
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            clock = time.thread_time if threads == 1 else time.perf_counter
            for rows in args.rows:
                result: dict[str, object] = {"threads": threads, "rows": rows}
                for name, gemm in contenders(args.isa).items():
                    if args.only and name not in args.only:
                        continue
                    if name == "packed" and (threads > 1 or not torch._C.has_mkl):
                        continue  # serial: compared on one thread only
                    ms = time_step(gemm, weights, rows, args.repeats, clock) * 1e3
                    result[f"{name}_ms"] = round(ms, 2)
                print(json.dumps(result), flush=True)
    print(json.dumps({"load_after": os.getloadavg()}))


if __name__ == "__main__":
    main()

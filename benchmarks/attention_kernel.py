"""The native paged attention kernel alone (``hybridkv/native/attention.c``), on B1 small
checkpoints' shapes (12 heads over 4 kv heads of 64, blocks of 16, float32 pages):

- ``decode``: 12 requests at contexts 16, 61, ..., 511 (B1's mixed workload's decode steps),
  12 layers of pages (~78 MB of K/V: past the caches); ms per step and GB/s of K/V read;
- ``prefill``: one layer's mixed step: a ``--chunk``-token prompt chunk from position 0 with 11
  decodes alongside.

Times are the best of ``--repeats``; ``--threads 1`` uses this thread's CPU time (steady on a
shared machine), more threads wall time (quiet machine only).

    .venv/bin/python benchmarks/attention_kernel.py --threads 1
    .venv/bin/python benchmarks/attention_kernel.py --threads 2 --page-dtype bfloat16

``--baseline DIR`` also times an older kernel (``DIR/attention.c`` and its headers, e.g. from
``git archive <commit> src/hybridkv/native``), alternating with this one in the same process,
and checks that both give the same bits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from hybridkv.native import load_library
from hybridkv.native.attention import AttentionKernels, KernelTable, load_attention

HEADS, KV_HEADS, DIM, BLOCK, LAYERS = 12, 4, 64, 16, 12
DECODE_CONTEXTS = [16 + 45 * i for i in range(12)]


def make_case(contexts: list[int], chunk: int, dtype: torch.dtype, layers: int) -> tuple:  # type: ignore[type-arg]
    """Pages of ``layers`` layers and one step's table: request 0 computes ``chunk`` prompt
    tokens from 0 (none if 0), the others one token after their context."""
    ctx = ([chunk - 1] if chunk else []) + contexts
    gen = torch.Generator().manual_seed(0)
    blocks = [(c + BLOCK) // BLOCK for c in ctx]
    num_blocks = sum(blocks) + 1
    free = torch.randperm(num_blocks - 1, generator=gen) + 1  # scattered, as in a real cache
    table = torch.zeros(len(ctx), max(blocks), dtype=torch.int64)
    used = 0
    for r, n in enumerate(blocks):
        table[r, :n], used = free[used : used + n], used + n
    rows = [0] * chunk + list(range(1 if chunk else 0, len(ctx)))
    pos = list(range(chunk)) + ctx[1 if chunk else 0 :]
    meta = KernelTable.checked(table, torch.tensor(rows), torch.tensor(pos), 0, BLOCK, num_blocks)
    shape = (num_blocks, 2, BLOCK, KV_HEADS, DIM)
    pages = [torch.randn(shape, generator=gen).to(dtype) for _ in range(layers)]
    qkv = torch.randn(len(rows), HEADS + 2 * KV_HEADS, DIM, generator=gen)
    return pages, meta, qkv


def best_of(
    repeats: int, clock: Callable[[], float], fns: list[Callable[[], object]]
) -> list[float]:
    """Each ``fn``'s best time over ``repeats``, the fns run alternately (same conditions)."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times, strict=True):
            began = clock()
            fn()
            spent.append(clock() - began)
    return [min(spent) for spent in times]


def run(kernels: list[AttentionKernels], chunk: int, dtype: torch.dtype, args: argparse.Namespace) -> list[dict[str, float]]:  # fmt: skip
    """One case, timed for each of ``kernels`` (alternating); outputs must agree bit for bit."""
    layers = 1 if chunk else LAYERS
    pages, meta, qkv = make_case(DECODE_CONTEXTS[1 if chunk else 0 :], chunk, dtype, layers)
    q, k, v = qkv[:, :HEADS], qkv[:, HEADS : HEADS + KV_HEADS], qkv[:, HEADS + KV_HEADS :]
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    outs = [kern.forward(q, k, v, pages[0], meta, DIM**-0.5) for kern in kernels]
    if any(not torch.equal(outs[0], out) for out in outs):
        raise SystemExit("the baseline kernel's outputs differ from this one's")

    def step(kern: AttentionKernels) -> Callable[[], None]:
        def once() -> None:
            for layer_pages in pages:
                kern.forward(q, k, v, layer_pages, meta, DIM**-0.5)

        return once

    keys = sum(int(p) + 1 for p in meta.positions[chunk:]) + chunk
    kv_bytes = keys * KV_HEADS * DIM * 2 * pages[0].element_size() * layers
    return [
        {"ms": seconds * 1e3, "kv_MB": kv_bytes / 1e6, "GB_per_s": kv_bytes / seconds / 1e9}
        for seconds in best_of(args.repeats, clock, [step(kern) for kern in kernels])
    ]


def baseline(source_dir: Path) -> AttentionKernels:
    """Another version's kernel: ``source_dir`` holds its ``attention.c`` and headers."""
    lib = load_library(source_dir / "attention.c", "baseline attention", "no baseline")
    if lib is None:
        raise SystemExit(f"cannot build {source_dir / 'attention.c'}")
    return AttentionKernels(lib)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--chunk", type=int, default=1024, help="prefill case's prompt chunk")
    p.add_argument("--page-dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--baseline", type=Path, help="directory of an older attention.c + headers")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    kernels = load_attention()
    if kernels is None:
        p.error("the native attention kernels are not available (HYBRIDKV_NATIVE=0 or no compiler)")
    versions = {"this": kernels} | ({"baseline": baseline(args.baseline)} if args.baseline else {})
    dtype = getattr(torch, args.page_dtype)
    result: dict[str, dict[str, dict[str, float]]] = {}
    for case, chunk in (("decode", 0), ("prefill", args.chunk)):
        timed = run(list(versions.values()), chunk, dtype, args)
        result[case] = dict(zip(versions, timed, strict=True))
        for name, r in result[case].items():
            print(f"{case:8s} {name:8s} {r['ms']:8.2f} ms  {r['kv_MB']:7.1f} MB  {r['GB_per_s']:6.1f} GB/s", file=sys.stderr)  # fmt: skip
    print(json.dumps({"benchmark": "attention_kernel", "threads": args.threads, "page_dtype": args.page_dtype, "results": result}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

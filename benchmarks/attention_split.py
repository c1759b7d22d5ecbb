"""Where the ``attention`` time of B1's mixed workload goes, per layer call: the native kernel
call itself (``hk_attn``: page writes of the step's K/V, then attention) against the Python
around it (``AttentionKernels.forward``'s checks and arguments, ``PagedAttention.forward``'s
lookups and reshape). Same workload as ``mixed_profile.py`` (same seed and engine limits; the
first of two rounds warms up); calls split by step kind (``decode``: one token per request,
``mixed``: prompt tokens too).

``--threads 1`` times with this thread's CPU time (steady on a loaded machine); more threads
use wall time (quiet machine only: then the kernel's OpenMP threads count once).

    .venv/bin/python benchmarks/attention_split.py --threads 1 --sizes small --archs qwen3_full
    .venv/bin/python benchmarks/attention_split.py --quick     # seconds; run by the tests
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from throughput import add_case_args, b1_machine, make_llm, run_cases
from throughput_mixed import MixedWorkload, make_requests

PARTS = ("forward", "kernels", "c")  # nested: each includes the next


@contextmanager
def timed_calls(kernels: Any, clock: Callable[[], float], sums: dict[str, float]) -> Iterator[None]:
    """Sum seconds of ``PagedAttention.forward``, ``AttentionKernels.forward`` and the C call
    into ``sums[f"{kind} {part}"]``, and count calls per kind."""
    from hybridkv.model.layers.attention import PagedAttention
    from hybridkv.native.attention import AttentionKernels

    layer_forward, kernels_forward, c_call = (
        PagedAttention.forward, AttentionKernels.forward, kernels._attn,
    )  # fmt: skip
    kind = ["decode"]

    def timed(part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            began = clock()
            out = fn(*args, **kwargs)
            sums[f"{kind[0]} {part}"] += clock() - began
            return out

        return call

    def layer(
        self: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Any, *a: Any
    ) -> Any:
        table = ctx.attn_meta[self.layer_id].table
        kind[0] = "decode" if table.rows.shape[0] == table.block_table.shape[0] else "mixed"
        sums[f"{kind[0]} calls"] += 1
        return timed_layer(self, q, k, v, ctx, *a)

    timed_layer = timed("forward", layer_forward)
    PagedAttention.forward = layer  # type: ignore[method-assign]
    AttentionKernels.forward = timed("kernels", kernels_forward)  # type: ignore[method-assign]
    kernels._attn = timed("c", c_call)
    try:
        yield
    finally:
        PagedAttention.forward = layer_forward  # type: ignore[method-assign]
        AttentionKernels.forward = kernels_forward  # type: ignore[method-assign]
        kernels._attn = c_call


def split_case(path: Path, dtype: str, work: MixedWorkload, threads: int) -> dict[str, Any]:
    from hybridkv import SamplingParams
    from hybridkv.native.attention import load_attention

    kernels = load_attention()
    if kernels is None:
        raise SystemExit("the native attention kernels are unavailable")
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    reqs = make_requests(vocab, work)
    llm = make_llm(path, dtype, max_num_seqs=work.concurrency, max_num_batched_tokens=2048,
                   max_model_len=work.prompt_range[1] + work.output_range[1] + 16)  # fmt: skip
    clock = time.thread_time if threads == 1 else time.perf_counter
    sums: dict[str, float] = defaultdict(float)
    for _ in range(2):  # round 0 warms up
        for prompt, n in zip(reqs.prompts, reqs.output_lens, strict=True):
            params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
            llm.engine.add_request(prompt, params)
        sums.clear()
        with timed_calls(kernels, clock, sums):
            while llm.engine.has_unfinished_requests():
                llm.engine.step()
    return {kind: per_call(sums, kind) for kind in ("decode", "mixed") if sums[f"{kind} calls"]}


def per_call(sums: dict[str, float], kind: str) -> dict[str, float]:
    """Microseconds per call: the C call, the wrapper's Python, the layer's Python."""
    calls = sums[f"{kind} calls"]
    forward, kernels, c = (sums[f"{kind} {p}"] / calls * 1e6 for p in PARTS)
    return {
        "calls": calls,
        "total_us": forward,
        "c_us": c,
        "wrapper_us": kernels - c,
        "layer_us": forward - kernels,
        "total_s": sums[f"{kind} forward"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="qwen3 tiny, 6 short requests")
    add_case_args(p, dtypes=["float32"])
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = MixedWorkload(32, (16, 384), (8, 128), 16, repeats=1)
    if args.quick:
        args.sizes, args.archs = ["tiny"], ["qwen3"]
        work = MixedWorkload(6, (8, 48), (2, 8), 4, repeats=1)
    results = run_cases(args, lambda path, dtype: split_case(path, dtype, work, args.threads))
    for case, kinds in results.items():
        for kind, r in kinds.items():
            print(f"{case} {kind}: {r['calls']:.0f} calls, {r['total_s']:.3f} s; per call "
                  f"{r['total_us']:.1f} us = C {r['c_us']:.1f} + wrapper {r['wrapper_us']:.1f} "
                  f"+ layer {r['layer_us']:.1f}", file=sys.stderr)  # fmt: skip
    doc = {"benchmark": "attention_split", "threads": args.threads, "machine": b1_machine()}
    print(json.dumps({**doc, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""B1 floor: how long a checkpoint's matrix products alone take, on this machine.

Every engine that runs the model's projections through the same GEMM library (hybridkv and
transformers both use torch's: MKL for float32, oneDNN for bfloat16) pays at least this. The
script loads a checkpoint with hybridkv's loader, collects every projection weight (each
``Linear``, MoE experts, the lm_head) and times ``F.linear`` over them at the two shapes B1
runs: a prefill step of ``--prefill-tokens`` rows (the lm_head on ``--batch`` rows only, as both
engines keep only the last logits) and a decode step of ``--batch`` rows. Best of ``--repeats``.

    prefill floor tokens/s = prefill_tokens / prefill seconds
    decode floor tokens/s  = batch / decode-step seconds

An engine's B1 throughput can exceed transformers' by at most (transformers' time / floor).
Each shape is timed twice: with ``F.linear`` (what transformers calls) and through hybridkv's
projection GEMM (``ProjectionGemm``: the native skinny GEMM at decode row counts for float32),
keys ``hybridkv_*``.

    .venv/bin/python benchmarks/matmul_floor.py --sizes small
    .venv/bin/python benchmarks/matmul_floor.py --quick     # seconds; run by the tests
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from throughput import add_case_args, b1_machine, run_cases


def projection_weights(path: Path, dtype: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every projection weight ``[out, in]`` of the checkpoint (lm_head apart)."""
    from hybridkv.model.loading.loader import load_model

    model, _ = load_model(path, dtype, bf16_matmul="native")  # the GEMM transformers calls
    return weights_of(model)


def weights_of(model: Any) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A loaded model's projection weights ``[out, in]`` (lm_head apart), and its lm_head's."""
    from hybridkv.model.layers.linear import Linear
    from hybridkv.model.layers.mlp import TopKMoE

    weights: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, Linear) and module is not model.lm_head:
            weights.append(module.weight)
        elif isinstance(module, TopKMoE):  # top-k of E experts: k experts' worth per token
            weights += [module.input_linear.weight[0], module.output_linear.weight[0]] * (
                module.top_k
            )
    return weights, model.lm_head.weight


def gemms(weights: list[torch.Tensor], ours: bool) -> list[Callable[[torch.Tensor], Any]]:
    """One product per weight: ``F.linear``, or through hybridkv's ``ProjectionGemm``."""
    from hybridkv.model.layers.linear import ProjectionGemm

    if not ours:
        return [functools.partial(_f_linear, weight=w) for w in weights]
    gemm = ProjectionGemm()
    return [functools.partial(gemm, weight=w, bias=None) for w in weights]


def _f_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight)


def time_rows(
    weights: list[torch.Tensor],
    head: torch.Tensor,
    rows: int,
    head_rows: int,
    ours: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds of one pass over every projection at ``rows`` rows (the head at ``head_rows``)."""
    xs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
    h = torch.randn(head_rows, head.shape[1], dtype=head.dtype)
    *fns, head_fn = gemms([*weights, head], ours)
    for fn, w in zip(fns, weights, strict=True):  # warm-up (packs the weights once)
        fn(xs[w.shape[1]])
    head_fn(h)
    began = clock()
    for fn, w in zip(fns, weights, strict=True):
        fn(xs[w.shape[1]])
    head_fn(h)
    return clock() - began


def floor(path: Path, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    weights, head = projection_weights(path, dtype)
    result: dict[str, Any] = {"parameters": sum(w.numel() for w in weights) + head.numel()}
    for ours in (False, True):
        prefix = "hybridkv_" if ours else ""
        with torch.inference_mode():
            prefill = min(
                time_rows(weights, head, args.prefill_tokens, args.batch, ours)
                for _ in range(args.repeats)
            )
            decode = min(
                time_rows(weights, head, args.batch, args.batch, ours) for _ in range(args.repeats)
            )
        print(
            f"  {prefix or 'F.linear '}prefill floor {args.prefill_tokens / prefill:.0f} tok/s,"
            f" decode floor {args.batch / decode:.0f} tok/s",
            file=sys.stderr,
        )
        result |= {
            f"{prefix}prefill_s": prefill,
            f"{prefix}decode_step_s": decode,
            f"{prefix}prefill_floor_tokens_per_s": args.prefill_tokens / prefill,
            f"{prefix}decode_floor_tokens_per_s": args.batch / decode,
        }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny checkpoints, one repeat")
    add_case_args(p, dtypes=["float32"])
    p.add_argument("--prefill-tokens", type=int, default=2048, help="B1: 16 prompts x 128")
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats, args.prefill_tokens = ["tiny"], 1, 64
    torch.set_num_threads(args.threads)
    results = run_cases(args, lambda path, dtype: floor(path, dtype, args))
    print(json.dumps({"benchmark": "matmul_floor", "machine": b1_machine(), "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

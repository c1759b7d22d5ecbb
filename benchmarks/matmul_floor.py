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

    .venv/bin/python benchmarks/matmul_floor.py --sizes small
    .venv/bin/python benchmarks/matmul_floor.py --quick     # seconds; run by the tests
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from throughput import add_case_args, b1_machine, run_cases


def projection_weights(path: Path, dtype: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every projection weight ``[out, in]`` of the checkpoint (lm_head apart)."""
    from hybridkv.model import load_model
    from hybridkv.model.layers.linear import Linear
    from hybridkv.model.layers.mlp import TopKMoE

    model, _ = load_model(path, dtype, bf16_matmul="native")  # the GEMM transformers calls
    weights: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, Linear) and module is not model.lm_head:
            weights.append(module.weight)
        elif isinstance(module, TopKMoE):  # top-k of E experts: k experts' worth per token
            weights += [module.input_linear.weight[0], module.output_linear.weight[0]] * (
                module.top_k
            )
    return weights, model.lm_head.weight


def time_rows(weights: list[torch.Tensor], head: torch.Tensor, rows: int, head_rows: int) -> float:
    xs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
    h = torch.randn(head_rows, head.shape[1], dtype=head.dtype)
    began = time.perf_counter()
    for w in weights:
        torch.nn.functional.linear(xs[w.shape[1]], w)
    torch.nn.functional.linear(h, head)
    return time.perf_counter() - began


def floor(path: Path, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    weights, head = projection_weights(path, dtype)
    with torch.inference_mode():
        time_rows(weights, head, args.prefill_tokens, args.batch)  # warm-up
        prefill = min(
            time_rows(weights, head, args.prefill_tokens, args.batch) for _ in range(args.repeats)
        )
        decode = min(time_rows(weights, head, args.batch, args.batch) for _ in range(args.repeats))
    print(
        f"  prefill floor {args.prefill_tokens / prefill:.0f} tok/s,"
        f" decode floor {args.batch / decode:.0f} tok/s",
        file=sys.stderr,
    )
    return {
        "prefill_s": prefill,
        "decode_step_s": decode,
        "prefill_floor_tokens_per_s": args.prefill_tokens / prefill,
        "decode_floor_tokens_per_s": args.batch / decode,
        "parameters": sum(w.numel() for w in weights) + head.numel(),
    }


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

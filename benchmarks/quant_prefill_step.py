"""One prefill step of a quantized model, in tokens per CPU-second (one thread, the calling
thread's CPU time), this tree against another (``--other-src``, e.g. main's ``src``) A/B: the
two run in alternating child processes, one model load each, so load changes hit both alike.

The model is a ``make_model`` "small" checkpoint (random weights) with its projections packed
by the project's packer in place (``--mix``): ``q4_k_m`` like llama.cpp's Q4_K_M (attention v
and MLP down in Q6_K, the rest Q4_K), ``q8_0`` (every projection Q8_0). Embedding, lm_head,
norms stay float32 as loaded. Each child runs one warm-up step, then ``--repeats`` prefill
steps of ``--tokens`` tokens (a fresh request each), and prints the best.

    PYTHONPATH=src:. .venv/bin/python benchmarks/quant_prefill_step.py \\
        --arch granitemoehybrid --mix q4_k_m --tokens 128 256 512 --other-src /work/main/src
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from bench_common import cpu_flags, ensure_checkpoint, machine_info

CACHE = Path(
    os.environ.get("HYBRIDKV_BENCH_CACHE", Path.home() / ".cache/hybridkv/bench-checkpoints")
)


def quantize_model(model: torch.nn.Module, mix: str) -> int:
    """Pack every projection ``Linear`` of ``model`` in place; returns how many."""
    from hybridkv.model.layers.linear import Linear
    from hybridkv.model.layers.quant_linear import set_quantized_weight
    from hybridkv.native.quant_blocks import QuantFormat, pack

    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, Linear) or "lm_head" in name or module.in_features % 256:
            continue
        q6 = any(part in name for part in ("v_proj", "down_proj", "output_linear"))
        fmt = QuantFormat.Q8_0 if mix == "q8_0" else QuantFormat.Q6_K if q6 else QuantFormat.Q4_K
        weight = module.weight.detach().float().numpy().astype(np.float32)
        set_quantized_weight(module, torch.from_numpy(pack(weight, fmt)), fmt)
        count += 1
    return count


def child(args: argparse.Namespace) -> dict[str, float]:
    """Best tokens per CPU-second of a prefill step at each of ``args.tokens``."""
    from tests.support.driver import RunnerDriver

    from hybridkv.kv.spec import create_layout
    from hybridkv.model.loading.loader import load_model
    from hybridkv.model.step.runner import ModelRunner

    torch.set_num_threads(1)
    model, cfg = load_model(ensure_checkpoint(CACHE, args.arch, "small"))
    quantized = quantize_model(model, args.mix)
    found: dict[str, float] = {"quantized_linears": quantized}
    with torch.inference_mode():
        for tokens in args.tokens:
            layout = create_layout(cfg.layer_specs(16, "float32"))
            groups = len(layout.attention_group_ids)  # the driver numbers blocks across groups
            runner = ModelRunner(model, cfg, layout, groups * (tokens // 16 + 1) + 2, 2)
            best = float("inf")
            for rep in range(args.repeats + 1):
                driver = RunnerDriver(runner)
                ids = torch.randint(
                    3, 1000, (tokens,), generator=torch.Generator().manual_seed(rep)
                )
                driver.add("r", ids.tolist())
                start = time.thread_time()
                driver.step({"r": tokens})
                if rep:
                    best = min(best, time.thread_time() - start)
            found[f"tokens_{tokens}_per_cpu_s"] = tokens / best
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", default="granitemoehybrid")
    p.add_argument("--mix", choices=["q4_k_m", "q8_0"], default="q4_k_m")
    p.add_argument("--tokens", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2, help="A/B rounds (each: this tree, other)")
    p.add_argument("--other-src", type=Path, help="the other tree's src (A/B)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    here = Path(__file__).resolve().parent
    trees = {"this": here.parent / "src"} | ({"other": args.other_src} if args.other_src else {})
    report = {
        "benchmark": "quant_prefill_step",
        "machine": machine_info(cpu_flags=cpu_flags(), load=os.getloadavg()),
        "arch": args.arch,
        "mix": args.mix,
        "trees": {k: str(v) for k, v in trees.items()},
        "rounds": [],
    }
    argv_child = [sys.argv[0], "--child", "--arch", args.arch, "--mix", args.mix]
    argv_child += ["--repeats", str(args.repeats), "--tokens", *map(str, args.tokens)]
    for _ in range(args.rounds):
        row = {}
        for name, src in trees.items():
            env = dict(os.environ, PYTHONPATH=f"{src}:{here.parent}:{here}")
            out = subprocess.run(
                [sys.executable, *argv_child], env=env, check=True, capture_output=True, text=True
            )
            row[name] = json.loads(out.stdout.strip().splitlines()[-1])
            print(name, row[name], file=sys.stderr, flush=True)
        report["rounds"].append(row)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

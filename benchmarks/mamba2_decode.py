"""The Mamba2 decode step of ``--layers`` layers outside the engine: the mixer's torch step
(``Mamba2Mixer._decode`` + ``GatedRMSNorm``) against the fused native step (``native/ssm.c``,
norm included), from the input projection to the normed output, at Granite 4.0-H small's shape
(24 heads of 64, state 64, one group, conv 4) for ``--rows`` requests on scattered slots. CPU
time of this thread on one thread (a loaded machine barely changes it), median of
``--repeats`` passes over all layers, the two paths alternating.

Between two layers ``--flush-mb`` of memory is streamed (default 32), as a decode step's
projection weights stream through the caches: the states then come from memory as in the
engine. ``--flush-mb 0`` keeps them in cache.

    .venv/bin/python benchmarks/mamba2_decode.py                  # 12 rows, 9 layers
    .venv/bin/python benchmarks/mamba2_decode.py --rows 32
    .venv/bin/python benchmarks/mamba2_decode.py --quick     # 2 rows, 2 layers; run by the tests
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from hybridkv.model.config.mamba import MambaConfig
from hybridkv.model.layers.mamba2 import Mamba2Mixer
from hybridkv.model.layers.step_context import StateMeta
from throughput import b1_machine

HEADS, P, N, K, HIDDEN = 24, 64, 64, 4, 768


def decode_meta(rows: int, slots: torch.Tensor) -> StateMeta:
    empty = torch.zeros(0, dtype=torch.int64)
    no_rows = torch.zeros(0, 1, dtype=torch.int64)
    return StateMeta(torch.arange(rows), slots, None, no_rows, no_rows.bool(), empty, empty, empty)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=12)
    p.add_argument("--layers", type=int, default=9)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--flush-mb", type=int, default=32)
    p.add_argument("--quick", action="store_true", help="2 rows, 2 layers, 1 repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.layers, args.repeats, args.flush_mb = 2, 2, 1, 1
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    cfg = MambaConfig(HEADS, P, N, 1, K, 64, True, False, 0.0, float("inf"))
    mixer = Mamba2Mixer(0, HIDDEN, cfg, 1e-6)
    gen = torch.Generator().manual_seed(0)
    for param in mixer.parameters():
        param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    rows, slots_per_layer = args.rows, args.rows + 4
    slots = torch.randperm(slots_per_layer, generator=gen)[:rows]  # scattered
    layers = [
        (
            torch.randn(slots_per_layer, cfg.conv_dim, K - 1, generator=gen),
            torch.randn(slots_per_layer, HEADS, P, N, generator=gen) * 0.1,
        )
        for _ in range(args.layers)
    ]
    width = cfg.intermediate_size + cfg.conv_dim + HEADS
    proj = torch.randn(rows, width, generator=gen)
    gate, xbc, dt = torch.split(proj, [cfg.intermediate_size, cfg.conv_dim, HEADS], -1)
    meta = decode_meta(rows, slots)
    flush = torch.zeros(args.flush_mb * 2**18)
    step = mixer._native_step(proj, *layers[0])
    if step is None:
        raise SystemExit("native kernels unavailable (no compiler or HYBRIDKV_NATIVE=0)")
    y = torch.empty(rows, cfg.intermediate_size)

    def torch_layer(conv: torch.Tensor, ssm: torch.Tensor) -> object:
        return mixer.norm(mixer._decode(xbc, dt, conv, ssm, meta), gate)

    def native_layer(conv: torch.Tensor, ssm: torch.Tensor) -> object:
        return step.kernels.mamba_step_((conv, ssm), slots, meta.decode_token_idx, proj,
                                        step.weights, y, step.norm)  # fmt: skip

    def all_layers(fn: Callable[[torch.Tensor, torch.Tensor], object]) -> float:
        total = 0.0
        for conv, ssm in layers:
            flush.add_(1.0)  # stream memory: the states drop out of the caches
            began = time.thread_time()
            fn(conv, ssm)
            total += time.thread_time() - began
        return total * 1e3

    times: dict[str, list[float]] = {"torch": [], "native": []}
    for _ in range(args.repeats + 1):  # the first pass warms up
        times["torch"].append(all_layers(torch_layer))
        times["native"].append(all_layers(native_layer))
    torch_ms, native_ms = (statistics.median(t[1:] or t) for t in times.values())
    state_mb = rows * args.layers * HEADS * P * N * 4 / 1e6
    result = {
        "benchmark": "mamba2_decode",
        "machine": b1_machine(),
        "rows": rows,
        "layers": args.layers,
        "flush_mb": args.flush_mb,
        "torch_ms": torch_ms,
        "native_ms": native_ms,
        "speedup": torch_ms / native_ms,
        "native_state_gb_per_s": 2 * state_mb / native_ms,  # read + write
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

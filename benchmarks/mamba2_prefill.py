"""One Mamba2 layer's prefill outside the engine, torch path against the native kernels
(``native/ssm_prefill.c``), CPU time of this thread on one thread (a loaded machine barely
changes it): conv + SiLU, the scan, the gated RMS norm, at Granite 4.0-H small's shape (24 heads
of 64, state 64, one group, conv 4, chunk 64) for ``--rows`` requests of ``--len`` tokens each
continuing from non-zero states. Median of ``--repeats``.

    .venv/bin/python benchmarks/mamba2_prefill.py                  # 16 x 128 tokens
    .venv/bin/python benchmarks/mamba2_prefill.py --rows 1 --len 2048
    .venv/bin/python benchmarks/mamba2_prefill.py --quick     # 2 x 16 tokens, run by the tests
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hybridkv.model.layers.norm import GatedRMSNorm
from hybridkv.model.layers.short_conv import conv_chunk_
from hybridkv.model.layers.ssd import ssd_chunk_scan
from hybridkv.native.ssm_prefill import PrefillRows, load_ssm_prefill
from throughput import b1_machine

HEADS, P, N, K, CHUNK = 24, 64, 64, 4, 64


def cpu_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        began = time.thread_time()
        fn()
        times.append((time.thread_time() - began) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="2 x 16 tokens, 1 repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.len, args.repeats = 2, 16, 1
    kernels = load_ssm_prefill()
    if kernels is None:
        raise SystemExit("native kernels unavailable (no compiler or HYBRIDKV_NATIVE=0)")
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    rows, length, inner = args.rows, args.len, HEADS * P
    channels, tokens = inner + 2 * N, args.rows * args.len
    gen = torch.Generator().manual_seed(0)
    xbc = torch.randn(tokens, channels, generator=gen)
    dt = torch.rand(tokens, HEADS, generator=gen) * 0.1
    a = -torch.rand(HEADS, generator=gen)
    d, gate = torch.randn(HEADS, generator=gen), torch.randn(tokens, inner, generator=gen)
    conv = nn.Conv1d(channels, channels, K, groups=channels)
    norm = GatedRMSNorm(inner, 1, 1e-6)
    states = torch.randn(rows, HEADS, P, N, generator=gen)
    conv_states = torch.randn(rows, channels, K - 1, generator=gen)
    lens = torch.full((rows,), length)
    slots = torch.arange(rows)
    spans = PrefillRows(slots * length, lens, slots)
    y = torch.empty(tokens, inner)

    def torch_path() -> object:
        out = F.silu(conv_chunk_(xbc.view(rows, length, -1), conv_states, slots, lens, conv))
        x, b, c = out.split([inner, N, N], -1)
        b, c = (t.reshape(rows, length, 1, N).expand(-1, -1, HEADS, -1) for t in (b, c))
        x = x.reshape(rows, length, HEADS, P)
        scan = ssd_chunk_scan(x, dt.view(rows, length, HEADS), a, b, c, states, CHUNK)[0]
        out = (scan + x * d[:, None]).reshape(tokens, inner) * F.silu(gate)
        return F.rms_norm(out, (inner,), eps=1e-6) * norm.weight  # GatedRMSNorm's torch path

    def native_path() -> object:
        act = kernels.conv_chunk_(conv_states, spans, xbc, conv.weight[:, 0, :], conv.bias)
        kernels.ssd_scan_(states, spans, act, dt, a, d, 1, y)
        return kernels.gated_rms_norm(y, gate, norm.weight, 1, 1e-6, True, in_place=True)

    result: dict[str, object] = {
        "benchmark": "mamba2_prefill",
        "machine": b1_machine(),
        "rows": rows,
        "len": length,
        "torch_ms": (torch_ms := cpu_ms(torch_path, args.repeats)),
        "native_ms": (native_ms := cpu_ms(native_path, args.repeats)),
    }
    result["speedup"] = torch_ms / native_ms
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``moe.dispatch`` equals the per-token definition ``sum_j w_j * expert_{idx_j}(x)``, with
experts that get no token, and the MoE benchmark script runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from hybridkv.model.layers.moe import dispatch

ROOT = Path(__file__).resolve().parents[2]


def test_dispatch_matches_the_per_token_sum() -> None:
    gen = torch.Generator().manual_seed(0)
    experts = [torch.randn(8, 8, generator=gen) for _ in range(5)]
    x = torch.randn(7, 8, generator=gen)
    idx = torch.tensor([[0, 3], [3, 0], [1, 3], [3, 1], [0, 1], [1, 0], [3, 0]])  # 2, 4 unused
    w = torch.rand(7, 2, generator=gen)
    got = dispatch(x, idx, w, 5, lambda e, rows: rows @ experts[e])
    want = torch.stack(
        [sum(w[t, j] * (x[t] @ experts[int(idx[t, j])]) for j in range(2)) for t in range(7)]
    )
    assert torch.allclose(got, want, atol=1e-6)


def test_moe_benchmark_runs() -> None:
    args = ["--tokens", "1", "4", "--hidden", "32", "--inner", "16", "--experts", "4"]
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "moe_dispatch.py"), *args, "--top-k", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["1", "4"] and all(float(v) > 0 for r in rows for v in r[1:])

"""MoE dispatch: the sorted-token ``moe.dispatch`` against the earlier ``index_add_`` scatter
and a dense gated MLP with the same active FLOPs (hidden H, k experts of inner I vs one MLP of
inner k*I), float32, one thread count as torch sets it. Prints median ms per call.

    PYTHONPATH=src .venv/bin/python benchmarks/moe_dispatch.py [--tokens 1 16 512]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hybridkv.model.layers.moe import dispatch


def _index_add(
    x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, experts: int, fn
) -> torch.Tensor:  # type: ignore[no-untyped-def]
    k = idx.shape[1]
    order = idx.flatten().argsort(stable=True)
    counts = torch.bincount(idx.flatten(), minlength=experts).tolist()
    tokens = order // k
    routed = x[tokens]
    out = torch.empty_like(routed)
    start = 0
    for e, c in enumerate(counts):
        if c:
            out[start : start + c] = fn(e, routed[start : start + c])
            start += c
    out = out * w.flatten()[order][:, None]
    return torch.zeros_like(x).index_add_(0, tokens, out)


def _time(fn: Callable[[], torch.Tensor], reps: int) -> float:
    fn()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 512])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--inner", type=int, default=512)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    w_in = torch.randn(a.experts, 2 * a.inner, a.hidden, generator=gen) * 0.02
    w_out = torch.randn(a.experts, a.hidden, a.inner, generator=gen) * 0.02
    dense_in = torch.randn(2 * a.top_k * a.inner, a.hidden, generator=gen) * 0.02
    dense_out = torch.randn(a.hidden, a.top_k * a.inner, generator=gen) * 0.02

    def expert(e: int, rows: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(rows, w_in[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, w_out[e])

    def dense(x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, dense_in).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, dense_out)

    print(f"H={a.hidden} I={a.inner} E={a.experts} k={a.top_k} threads={torch.get_num_threads()}")
    print("tokens  index_add_ms  sorted_ms  dense_same_flops_ms")
    with torch.inference_mode():
        for n in a.tokens:
            x = torch.randn(n, a.hidden, generator=gen)
            logits = torch.randn(n, a.experts, generator=gen)
            top, idx = logits.topk(a.top_k, dim=-1)
            w = torch.softmax(top, dim=-1)
            old = _time(lambda: _index_add(x, idx, w, a.experts, expert), a.reps)  # noqa: B023
            new = _time(lambda: dispatch(x, idx, w, a.experts, expert), a.reps)  # noqa: B023
            ref = _time(lambda: dense(x), a.reps)  # noqa: B023
            print(f"{n:6d}  {old:12.2f}  {new:9.2f}  {ref:19.2f}")


if __name__ == "__main__":
    main()

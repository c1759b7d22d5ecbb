"""B3 — TTFT through the real engine: the chat trace with prefix caching on vs off, and a
4k-token hit against the same prompt cold.

Small random checkpoints (built if missing): Granite 4.0-H (``granitemoehybrid``, 9 Mamba2 +
3 attention layers) and Qwen3.5 (``qwen3_5``, Gated DeltaNet + attention: the qwen35-like
layout). ``LLM(dtype="float32", max_num_seqs=1)`` with the engine's defaults otherwise
(``max_num_batched_tokens`` 2048, ``state_checkpoint_budget`` 0.1 of ``--kv-memory``).

* ``chat``: the trace of ``prefix_trace_workload.py`` (token ids folded into the model's
  vocabulary), one request at a time, each turn's message ends passed as
  ``cache_boundaries`` (what ``LLM.chat`` passes). ``max_tokens=1``: a turn's reply is part of
  the next turn's prompt either way, so the next turn resumes at this turn's prompt end.
  The two engines (caching off, caching on) take turns request by request, so both see the
  same machine load. TTFT is the engine's own ``ttft_s`` (arrival to first token).
* ``hit4k``: a fresh prompt of ``--hit-len`` tokens cold, then the same prompt plus 16 new
  tokens (a hit of every full block of the first): TTFT of each, ``--repeats`` times.

Reports medians, the CPU time of the process per request (meaningful under load), the
machine's CPU flags and load average. One JSON object on stdout.

    .venv/bin/python benchmarks/prefix_trace_ttft.py                       # both models
    .venv/bin/python benchmarks/prefix_trace_ttft.py --quick               # tiny, seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import cpu_flags, machine_info
from prefix_trace_workload import make_trace

ARCHS = ("granitemoehybrid", "qwen3_5")


def make_llm(path: Path, caching: bool, kv_memory: str) -> Any:
    from hybridkv import LLM

    return LLM(
        str(path),
        dtype="float32",
        enable_prefix_caching=caching,
        max_num_seqs=1,
        kv_cache_memory=kv_memory,
    )


def timed(llm: Any, prompt: list[int], bounds: list[int]) -> dict[str, float]:
    """One request, one output token: engine TTFT, wall and process CPU seconds, its hit."""
    from hybridkv import SamplingParams

    params = SamplingParams(
        max_tokens=1, temperature=0.0, extra_args={"cache_boundaries": bounds} if bounds else None
    )
    cpu, wall = time.process_time(), time.perf_counter()
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"ttft": out.metrics["ttft_s"], "wall": wall, "cpu": cpu, "hit": out.num_cached_tokens}


def med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def chat(engines: dict[str, Any], vocab: int, conversations: int, turns: int) -> dict[str, Any]:
    trace = make_trace(conversations, turns)
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in engines}
    for turn in trace:
        prompt = [3 + t % (vocab - 3) for t in turn.prompt]
        for mode, llm in engines.items():
            rows[mode].append(timed(llm, prompt, list(turn.message_ends)))
    out: dict[str, Any] = {
        "requests": len(trace),
        "prompt_tokens": sum(len(t.prompt) for t in trace),
    }
    for mode, r in rows.items():
        out[mode] = {
            "computed_tokens": out["prompt_tokens"] - sum(int(x["hit"]) for x in r),
            "ttft_median_s": med(r, "ttft"),
            "ttft_mean_s": statistics.fmean(x["ttft"] for x in r),
            "cpu_s_total": sum(x["cpu"] for x in r),
        }
    off, on = out["off"], out["on"]
    out["ttft_mean_ratio_off_on"] = off["ttft_mean_s"] / on["ttft_mean_s"]
    out["cpu_ratio_off_on"] = off["cpu_s_total"] / on["cpu_s_total"]
    return out


def hit4k(llm: Any, vocab: int, length: int, repeats: int) -> dict[str, Any]:
    rng = random.Random(1)
    cold, hit = [], []
    for _ in range(repeats):
        prompt = [rng.randrange(3, vocab) for _ in range(length)]
        cold.append(timed(llm, prompt, []))
        hit.append(timed(llm, prompt + [rng.randrange(3, vocab) for _ in range(16)], []))
    assert all(h["hit"] >= length // 16 * 16 - 16 for h in hit), [h["hit"] for h in hit]
    return {
        "prompt_len": length,
        "hit_tokens": [int(h["hit"]) for h in hit],
        "cold": {"ttft_median_s": med(cold, "ttft"), "cpu_median_s": med(cold, "cpu")},
        "hit": {"ttft_median_s": med(hit, "ttft"), "cpu_median_s": med(hit, "cpu")},
        "ttft_ratio_cold_hit": med(cold, "ttft") / med(hit, "ttft"),
        "cpu_ratio_cold_hit": med(cold, "cpu") / med(hit, "cpu"),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from hybridkv.model.loading.make_model import ensure_model
    from hybridkv.paths import cache_dir

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--archs", nargs="+", default=list(ARCHS), choices=ARCHS)
    p.add_argument("--size", default="small", choices=["tiny", "small"])
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--hit-len", type=int, default=4000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv-memory", default="2GiB")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--quick", action="store_true", help="tiny checkpoints, 4 x 2 turns, 1 run")
    a = p.parse_args(argv)
    if a.quick:
        a.size, a.conversations, a.turns, a.hit_len, a.repeats = "tiny", 4, 2, 1000, 1
        a.kv_memory = "256MiB"
    torch.set_num_threads(a.threads)
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    for arch in a.archs:
        path = cache_dir() / "bench-checkpoints" / f"{arch}-{a.size}"
        ensure_model(arch, path, size=a.size, seed=0)
        vocab = json.loads((path / "config.json").read_text())["vocab_size"]
        engines = {m: make_llm(path, m == "on", a.kv_memory) for m in ("off", "on")}
        for llm in engines.values():  # warm-up: first-call costs stay out of the numbers
            timed(llm, [5 + i % (vocab - 5) for i in range(300)], [])
        results[arch] = {
            "hit4k": hit4k(engines["on"], vocab, a.hit_len, a.repeats),
            "chat": chat(engines, vocab, a.conversations, a.turns),
        }
        r = results[arch]
        print(
            f"{arch:17} hit {a.hit_len}: TTFT cold/hit x{r['hit4k']['ttft_ratio_cold_hit']:.1f} "
            f"(cpu x{r['hit4k']['cpu_ratio_cold_hit']:.1f})  chat TTFT off/on "
            f"x{r['chat']['ttft_mean_ratio_off_on']:.2f} (cpu x{r['chat']['cpu_ratio_off_on']:.2f})",
            file=sys.stderr,
        )
        print(json.dumps({arch: r}), file=sys.stderr)  # a long run's partial result
        engines.clear()
        gc.collect()  # free this model's KV pools before the next model's
    out = {
        "benchmark": "prefix_trace_ttft",
        "quick": a.quick,
        "size": a.size,
        "machine": machine_info(
            cpu_flags=cpu_flags(), load_average_start=load_before, load_average=os.getloadavg()
        ),
        "trace": {"conversations": a.conversations, "turns": a.turns},
        "results": results,
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

"""B1 — offline throughput: hybridkv ``LLM.generate`` against transformers ``generate``.

Same checkpoint, same prompts (random token ids), greedy, ``ignore_eos``, same thread count,
one process, runs alternating A, B, A, B after one warm-up run of each. Each run of an engine
is two calls::

    t_prefill = time(generate(prompts, max_new_tokens=1))      # the batch's first tokens
    t_total   = time(generate(prompts, max_new_tokens=G))
    prefill tokens/s = N * P / t_prefill
    decode  tokens/s = N * (G - 1) / (t_total - t_prefill)

Prefix caching is off in hybridkv (B3 measures it), so every call recomputes its prompts.
Prints one JSON document on stdout and a table on stderr.

    .venv/bin/python benchmarks/throughput.py            # tiny + small, float32 + bfloat16
    .venv/bin/python benchmarks/throughput.py --quick    # seconds; run by the test suite
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench_common import cpu_flags, ensure_checkpoint, machine_info
from hybridkv.model.families.registry import get_make_model_archs
from hybridkv.model.loading.matmul import cpu_has_native_bf16
from hybridkv.paths import cache_dir as hybridkv_cache_dir

ARCHS = ("qwen3", "gemma3", "granitemoehybrid")  # the default set; --archs takes any family
FIRST_TOKEN_ID = 3  # 0..2 are the tiny tokenizer's special tokens


@dataclass(frozen=True, slots=True)
class Workload:
    num_prompts: int
    prompt_len: int
    output_len: int
    repeats: int


@dataclass(frozen=True, slots=True)
class Timing:
    prefill_s: float
    total_s: float


class HybridKVEngine:
    name = "hybridkv"

    def __init__(self, path: Path, dtype: str, work: Workload) -> None:
        batch_tokens = work.num_prompts * work.prompt_len
        self.llm = make_llm(
            path,
            dtype,
            max_num_seqs=work.num_prompts,
            max_num_batched_tokens=max(2048, batch_tokens),
            max_model_len=work.prompt_len + work.output_len + 16,
        )

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        from hybridkv import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


class TransformersEngine:
    name = "transformers"

    def __init__(self, path: Path, dtype: str, work: Workload) -> None:
        self.model = load_transformers(path, dtype)

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        ids = torch.tensor(prompts, dtype=torch.long)  # [N, P], equal lengths: no padding
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,  # ignore_eos
                do_sample=False,
                pad_token_id=0,
            )
        return out[:, ids.shape[1] :].tolist()


Engine = HybridKVEngine | TransformersEngine


def make_llm(path: Path, dtype: str, prefix_caching: bool = False, **limits: int) -> Any:
    """hybridkv's ``LLM`` as both B1 scripts run it: prefix caching off (unless asked),
    768 MiB of KV."""
    from hybridkv import LLM

    return LLM(
        str(path),
        dtype=dtype,
        enable_prefix_caching=prefix_caching,
        kv_cache_memory="768MiB",
        **limits,
    )


def load_transformers(path: Path, dtype: str) -> Any:
    """The same checkpoint in transformers, quietly, in eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype)).eval()


def make_prompts(vocab_size: int, work: Workload, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(work.prompt_len)]
        for _ in range(work.num_prompts)
    ]


def time_run(engine: Engine, prompts: list[list[int]], work: Workload) -> Timing:
    start = time.perf_counter()
    engine.generate(prompts, 1)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    engine.generate(prompts, work.output_len)
    return Timing(prefill, time.perf_counter() - start)


def rates(t: Timing, work: Workload) -> dict[str, float]:
    decode_tokens = work.num_prompts * (work.output_len - 1)
    return {
        "prefill": work.num_prompts * work.prompt_len / t.prefill_s,
        "decode": decode_tokens / max(t.total_s - t.prefill_s, 1e-9),
        "total": work.num_prompts * (work.prompt_len + work.output_len) / t.total_s,
    }


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def greedy_agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of generated positions where both engines chose the same token."""
    same = sum(x == y for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))
    return same / max(1, sum(len(r) for r in a))


def bench_case(path: Path, dtype: str, work: Workload) -> dict[str, Any]:
    """A, B, A, B runs of both engines on one checkpoint and dtype."""
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    prompts = make_prompts(vocab, work)
    engines: list[Engine] = [
        HybridKVEngine(path, dtype, work),
        TransformersEngine(path, dtype, work),
    ]
    tokens = [e.generate(prompts, work.output_len) for e in engines]  # warm-up
    per_run: dict[str, list[dict[str, float]]] = {e.name: [] for e in engines}
    for _ in range(work.repeats):
        for engine in engines:
            per_run[engine.name].append(rates(time_run(engine, prompts, work), work))
    result: dict[str, Any] = {"greedy_agreement": greedy_agreement(tokens[0], tokens[1])}
    for name, runs in per_run.items():
        result[name] = {k: summary([r[k] for r in runs]) for k in ("prefill", "decode", "total")}
    ours, theirs = per_run["hybridkv"], per_run["transformers"]
    result["ratio"] = {  # paired runs: hybridkv / transformers
        k: summary([a[k] / b[k] for a, b in zip(ours, theirs, strict=True)])
        for k in ("prefill", "decode", "total")
    }
    return result


def add_case_args(p: argparse.ArgumentParser, dtypes: list[str]) -> None:
    """Which checkpoints and dtypes to run, how often, on how many threads (both B1 scripts)."""
    p.add_argument("--archs", nargs="+", default=list(ARCHS), choices=get_make_model_archs())
    p.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    p.add_argument("--dtypes", nargs="+", default=dtypes)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--cache-dir", type=Path, default=None, help="checkpoints (built if missing)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny models, 4x32 tokens, 1 repeat")
    add_case_args(p, dtypes=["float32", "bfloat16"])
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.num_prompts, args.prompt_len = ["tiny"], 4, 32
        args.output_len, args.repeats = 8, 1
    if args.output_len < 2:
        p.error("--output-len must be at least 2 (decode is measured after the first token)")
    return args


def default_cache_dir() -> Path:
    return hybridkv_cache_dir() / "bench-checkpoints"


def print_table(results: dict[str, Any]) -> None:
    """Medians with [min, max]; tokens/s for the engines, hybridkv / transformers for ratio."""
    head = f"{'case':<32}{'engine':<14}{'prefill':>26}{'decode':>26}"
    print(head, file=sys.stderr)
    for case, r in results.items():
        for name in ("hybridkv", "transformers", "ratio"):
            cells = "".join(_cell(r[name][phase]) for phase in ("prefill", "decode"))
            print(f"{case:<32}{name:<14}{cells}", file=sys.stderr)


def _cell(s: dict[str, float]) -> str:
    return f"{s['median']:.4g} [{s['min']:.4g}, {s['max']:.4g}]".rjust(26)


def run_cases(
    args: argparse.Namespace, bench: Callable[[Path, str], dict[str, Any]]
) -> dict[str, Any]:
    """``bench(checkpoint, dtype)`` for every size, architecture and dtype asked for."""
    cache_dir = args.cache_dir or default_cache_dir()
    results: dict[str, Any] = {}
    for size in args.sizes:
        for arch in args.archs:
            path = ensure_checkpoint(cache_dir, arch, size)
            for dtype in args.dtypes:
                case = f"{arch}-{size}-{dtype}"
                print(f"running {case}", file=sys.stderr)
                results[case] = bench(path, dtype)
    return results


def b1_machine() -> dict[str, Any]:
    """The machine, transformers' version and whether the CPU multiplies bfloat16 natively
    (if not, hybridkv's default ``bf16_matmul=auto`` multiplies bfloat16 models in float32)."""
    return machine_info(
        transformers=importlib.metadata.version("transformers"),
        cpu_native_bf16=cpu_has_native_bf16(),
        cpu_flags=cpu_flags(),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Workload(args.num_prompts, args.prompt_len, args.output_len, args.repeats)
    results = run_cases(args, lambda path, dtype: bench_case(path, dtype, work))
    doc = {
        "benchmark": "throughput",
        "machine": b1_machine(),
        "workload": asdict(work) | {"greedy": True, "ignore_eos": True},
        "baseline": "transformers generate (same checkpoint, prompts, threads)",
        "vllm": "skipped: vLLM CPU is not benchmarked by this script (optional third column)",
        "results": results,
    }
    print_table(results)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

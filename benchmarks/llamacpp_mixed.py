"""B1 against llama.cpp on its own GGUF files: ``hybridkv serve FILE`` and ``llama-server -m
FILE`` behind the same concurrent client (``throughput_mixed.py --baseline llamacpp``).

Per GGUF file (``setup_llamacpp_baseline.sh`` makes them):

- **mixed workload** (``throughput_mixed.make_requests``: N requests, prompts and outputs of
  uniform random lengths, greedy, EOS ignored, prompt caching off in both): all N sent at
  once by ``--concurrency`` client threads, as token ids; hybridkv ``--max-num-seqs`` and
  llama-server ``-np`` = ``--concurrency`` (each llama.cpp slot gets a context of
  ``--max-prompt + --max-output + 16``). Timed A B A B after one warm-up of each; the outputs
  of the warm-ups are compared request by request (``identical_requests``).
- **single stream decode**: one request, a 16-token prompt, ``--decode-tokens`` outputs, minus
  the same request with one output (its prefill), on both servers, A B A B; and
  ``llama-bench -p 0 -n 128`` (llama.cpp's own number) once per repeat, between them.

Both engines run ``--threads`` threads; both servers stay up through a file's runs, one
engine idle while the other is timed.

    .venv/bin/python benchmarks/throughput_mixed.py --baseline llamacpp \\
        --gguf /work/llamacpp/models/gemma3-small-q8_0.gguf --num-requests 32 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from llamacpp_servers import Server, hybridkv_server, llama_server
from mixed_workload import MixedWorkload, Requests, add_workload_args, make_requests, mixed_workload
from throughput import b1_machine, greedy_agreement, summary
from throughput_mixed import first_divergence

LLAMA_BIN = Path("/work/llamacpp/build/bin")
DECODE_PROMPT_LEN = 16


def generate(server: Server, reqs: Requests, concurrency: int) -> list[list[int]]:
    """Every request sent at once (``concurrency`` in flight); their output token ids."""
    with ThreadPoolExecutor(concurrency) as pool:
        jobs = [
            pool.submit(server.complete, p, n)
            for p, n in zip(reqs.prompts, reqs.output_lens, strict=True)
        ]
        return [job.result() for job in jobs]


def mixed(servers: list[Server], reqs: Requests, work: MixedWorkload) -> dict[str, Any]:
    tokens = [generate(s, reqs, work.concurrency) for s in servers]  # warm-up
    seconds: dict[str, list[float]] = {s.name: [] for s in servers}
    for _ in range(work.repeats):
        for server in servers:
            began = time.perf_counter()
            generate(server, reqs, work.concurrency)
            seconds[server.name].append(time.perf_counter() - began)
    ours, theirs = tokens
    out: dict[str, Any] = {
        "identical_requests": sum(a == b for a, b in zip(ours, theirs, strict=True)),
        "num_requests": len(reqs.prompts),
        "greedy_agreement": greedy_agreement(ours, theirs),
        "first_divergence": first_divergence(ours, theirs),
    }
    for name, times in seconds.items():
        out[name] = {"seconds": summary(times), "tokens_per_s": summary(
            [reqs.num_tokens / t for t in times])}  # fmt: skip
    a, b = (seconds[s.name] for s in servers)
    out["ratio"] = summary([y / x for x, y in zip(a, b, strict=True)])  # hybridkv / llama.cpp
    return out


def decode(
    servers: list[Server], bench: list[str], n: int, repeats: int, vocab: int
) -> dict[str, Any]:
    """Single-stream decode tokens/s of each server, and llama-bench's, alternating."""
    prompt = [(7 * i + 11) % (vocab - 3) + 3 for i in range(DECODE_PROMPT_LEN)]
    rates: dict[str, list[float]] = {s.name: [] for s in servers}
    rates["llama-bench"] = []
    for server in servers:  # warm-up
        server.complete(prompt, n)
    for _ in range(repeats):
        for server in servers:
            rates[server.name].append(_decode_rate(server, prompt, n))
        rates["llama-bench"].append(_llama_bench(bench))
    out: dict[str, Any] = {name: summary(r) for name, r in rates.items()}
    a, b = (rates[s.name] for s in servers)
    out["ratio"] = summary([x / y for x, y in zip(a, b, strict=True)])
    bench_rates = rates["llama-bench"]
    out["ratio_vs_llama_bench"] = summary([x / y for x, y in zip(a, bench_rates, strict=True)])
    return out


def _decode_rate(server: Server, prompt: list[int], n: int) -> float:
    began = time.perf_counter()
    server.complete(prompt, 1)
    prefill = time.perf_counter() - began
    began = time.perf_counter()
    server.complete(prompt, n)
    return (n - 1) / max(1e-9, time.perf_counter() - began - prefill)


def _llama_bench(cmd: list[str]) -> float:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    rows = json.loads(proc.stdout)
    return float(rows[0]["avg_ts"])


def bench_file(path: Path, args: argparse.Namespace, work: MixedWorkload) -> dict[str, Any]:
    from hybridkv.model.loading.hub import resolve_model_dir

    vocab = json.loads((resolve_model_dir(str(path)) / "config.json").read_text())["vocab_size"]
    reqs = make_requests(vocab, work)
    ctx = args.max_prompt + args.max_output + 16
    bench = [str(args.llama_bin / "llama-bench"), "-m", str(path), "-p", "0", "-n",
             str(args.decode_tokens), "-t", str(args.threads), "-r", "1", "-o", "json"]  # fmt: skip
    with (
        hybridkv_server(path, args.threads, work.concurrency, ctx) as ours,
        llama_server(args.llama_bin, path, args.threads, work.concurrency, ctx) as theirs,
    ):
        servers = [ours, theirs]
        result = {"mixed": mixed(servers, reqs, work)}
        result["decode"] = decode(servers, bench, args.decode_tokens, work.repeats, vocab)
    r, d = result["mixed"]["ratio"], result["decode"]["ratio"]
    print(f"  {path.name}: mixed hybridkv/llama.cpp {r['median']:.3g} [{r['min']:.3g},"
          f" {r['max']:.3g}], identical {result['mixed']['identical_requests']}/"
          f"{len(reqs.prompts)}; decode {d['median']:.3g}", file=sys.stderr)  # fmt: skip
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gguf", nargs="+", type=Path, required=True, help="GGUF files to serve")
    p.add_argument("--llama-bin", type=Path, default=LLAMA_BIN)
    add_workload_args(p, num_requests=32, concurrency=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--decode-tokens", type=int, default=128)
    args = p.parse_args(argv)
    if not (args.llama_bin / "llama-server").exists():
        p.error(f"no llama-server in {args.llama_bin} (setup_llamacpp_baseline.sh builds it)")
    if not (1 <= args.min_prompt <= args.max_prompt and 1 <= args.min_output <= args.max_output):
        p.error("length ranges must satisfy 1 <= min <= max")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = mixed_workload(args)
    results = {}
    for path in args.gguf:
        print(f"running {path}", file=sys.stderr)
        results[path.name] = bench_file(path, args, work)
    version = subprocess.run(
        [str(args.llama_bin / "llama-server"), "--version"], capture_output=True, text=True
    )
    doc = {
        "benchmark": "throughput_mixed --baseline llamacpp",
        "machine": b1_machine(),
        "llama_cpp": (version.stdout + version.stderr).strip().splitlines()[:2],
        "threads": args.threads,
        "workload": {**asdict(work), "greedy": True, "ignore_eos": True},
        "results": results,
    }
    print(json.dumps(doc, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Single-stream decode (issue 31): one request, a 16-token prompt, ``--decode-tokens`` greedy
outputs (EOS ignored), through hybridkv's ``LLM.generate`` and ``hybridkv serve`` (one
client), against llama.cpp's ``llama-server`` (one client) and ``llama-bench -p 0 -n N``, on
the same files and thread count.

Decode tokens/s = (N - 1) / (time of the N-output request - time of the 1-output request),
so the prefill and the request's own round trip cancel. Every engine stays up through a
file's runs (``LLM`` in a worker process of its own, idle on a pipe while the others are
timed) and they take turns, A B C ... A B C, ``--repeats`` rounds; llama-bench once a round.
``--baseline-src DIR`` adds the same hybridkv engines run from another source tree (e.g. main's
``src``): before / after in the same run; ``--program-off`` adds them with the compiled decode
step off (``HYBRIDKV_DECODE_PROGRAM=0``, ``model/compiled/program.py``). The load average is
printed with every round: the machine is shared.

    .venv/bin/python benchmarks/single_stream.py --threads 2 --repeats 5 \\
        --baseline-src /work/main/src --gguf /work/llamacpp/models/gemma3-small-q8_0.gguf
    .venv/bin/python benchmarks/single_stream.py --quick     # seconds: LLM only, tiny model

``--clock cpu --threads 1``: the LLM engines' decode tokens per second of their process's CPU
time (what another job on the shared machine barely changes), llama-bench's likewise (its
process's CPU time: ``quant_gguf_decode.llama_bench_seconds``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench_common import cpu_flags, machine_info
from llamacpp_servers import Server, hybridkv_server, llama_server
from quant_gguf_decode import llama_bench_seconds

LLAMA_BIN = Path("/work/llamacpp/build/bin")
PROMPT = [(7 * i + 11) % 997 + 3 for i in range(16)]
Rate = Callable[[int], float]  # decode tokens/s of one request of n outputs
PROGRAM_SWITCH = "HYBRIDKV_DECODE_PROGRAM"  # hybridkv.model.compiled.program.ENV_SWITCH


def decode_rate(
    complete: Callable[[int], object], n: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    began = clock()
    complete(1)
    prefill = clock() - began
    began = clock()
    complete(n)
    return (n - 1) / max(1e-9, clock() - began - prefill)


def worker(path: str, threads: int, cpu: bool) -> int:
    """``--worker``: an ``LLM`` on ``path``; each stdin line N -> one decode rate on stdout
    (``cpu``: per second of the process's CPU time)."""
    import torch

    from hybridkv import LLM, SamplingParams

    torch.set_num_threads(threads)
    llm = LLM(path, enable_prefix_caching=False, kv_cache_memory="768MiB", max_model_len=2048)

    def complete(n: int) -> object:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        return llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)

    print("ready", flush=True)
    clock = time.process_time if cpu else time.perf_counter
    for line in sys.stdin:
        print(json.dumps(decode_rate(complete, int(line), clock)), flush=True)
    return 0


@contextmanager
def llm_worker(path: Path, threads: int, src: Path | None, cpu: bool = False) -> Iterator[Rate]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if src is not None:
        env["PYTHONPATH"] = f"{src}{os.pathsep}{Path(__file__).parent}"
    cmd = [sys.executable, __file__, "--worker", str(path), "--threads", str(threads)]
    cmd += ["--clock", "cpu" if cpu else "wall"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    try:
        if stdout.readline().strip() != "ready":
            raise RuntimeError(f"LLM worker on {path} did not start")

        def rate(n: int) -> float:
            stdin.write(f"{n}\n")
            stdin.flush()
            return float(json.loads(stdout.readline()))

        yield rate
    finally:
        stdin.close()
        proc.wait(timeout=60)


def server_rate(server: Server) -> Rate:
    return lambda n: decode_rate(lambda k: server.complete(PROMPT, k), n)


def llama_bench(bin_dir: Path, path: Path, n: int, threads: int, cpu: bool = False) -> float:
    """``llama-bench -p 0 -n n``'s decode tokens/s; ``cpu`` (one thread): tokens per second of
    its CPU time, (user + sys of ``-n 16 + n``) - (of ``-n 16``) over n tokens, start-up and
    load cancelling out, the clock the LLM engines are timed on (``--clock cpu``)."""
    if cpu:
        return 1.0 / llama_bench_seconds(str(bin_dir / "llama-bench"), path, threads, n)
    cmd = [str(bin_dir / "llama-bench"), "-m", str(path), "-p", "0", "-n", str(n),
           "-t", str(threads), "-r", "1", "-o", "json"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    return float(json.loads(out.stdout)[0]["avg_ts"])


@contextmanager
def decode_program(on: bool) -> Iterator[None]:
    """Processes started inside run with the compiled decode step on / off (its switch)."""
    saved = os.environ.get(PROGRAM_SWITCH)
    os.environ[PROGRAM_SWITCH] = "1" if on else "0"
    try:
        yield
    finally:
        if saved is None:
            del os.environ[PROGRAM_SWITCH]
        else:
            os.environ[PROGRAM_SWITCH] = saved


def engines(stack: ExitStack, path: Path, args: argparse.Namespace) -> dict[str, Rate]:
    """Name -> decode rate of every engine of the run, all started (and stopped by ``stack``)."""
    srcs: list[tuple[str, Path | None, bool]] = [("", None, True)]
    if args.program_off:
        srcs.append((" no-program", None, False))
    if args.baseline_src is not None:
        srcs.append((" base", args.baseline_src, True))
    out: dict[str, Rate] = {}
    for suffix, src, program in srcs:
        with decode_program(program):
            worker = llm_worker(path, args.threads, src, args.clock == "cpu")
            out[f"LLM{suffix}"] = stack.enter_context(worker)
            if not args.quick and args.clock == "wall":
                served = hybridkv_server(path, args.threads, 1, 2048, src)
                out[f"serve{suffix}"] = server_rate(stack.enter_context(served))
    if args.llama and args.clock == "wall":
        served = llama_server(args.llama_bin, path, args.threads, 1, 2048)
        out["llama-server"] = server_rate(stack.enter_context(served))
    return out


def bench_file(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    with ExitStack() as stack:
        rates = engines(stack, path, args)
        for rate in rates.values():  # warm-up
            rate(args.decode_tokens)
        runs: dict[str, list[float]] = {name: [] for name in rates}
        loads: list[float] = []
        for _ in range(args.repeats):
            for name, rate in rates.items():
                runs[name].append(rate(args.decode_tokens))
            if args.llama:
                cpu = args.clock == "cpu"
                bench = llama_bench(args.llama_bin, path, args.decode_tokens, args.threads, cpu)
                runs.setdefault("llama-bench", []).append(bench)
            loads.append(os.getloadavg()[0])
            print(f"  {path.name}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in runs.items())
                  + f" (load {loads[-1]:.1f})", file=sys.stderr)  # fmt: skip
    out: dict[str, Any] = {name: _summary(r) for name, r in runs.items()}
    out["load_average"] = _summary(loads)
    for ours in (n for n in runs if n.startswith(("LLM", "serve"))):
        for theirs in ("llama-server", "llama-bench"):
            if theirs in runs:
                ratios = [a / b for a, b in zip(runs[ours], runs[theirs], strict=True)]
                out[f"{ours} / {theirs}"] = _summary(ratios)
    return out


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def quick_model(cache: Path | None) -> Path:
    from hybridkv.model.loading.make_model import ensure_model
    from hybridkv.paths import cache_dir

    path = (cache or cache_dir() / "bench") / "qwen3-tiny"
    ensure_model("qwen3", path, size="tiny", seed=0)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gguf", nargs="+", type=Path, default=[], help="model files (or dirs)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--baseline-src", type=Path, default=None, help="a second hybridkv src tree")
    p.add_argument("--program-off", action="store_true",
                   help="also run hybridkv with the compiled decode step off (A/B)")  # fmt: skip
    p.add_argument("--llama-bin", type=Path, default=LLAMA_BIN)
    p.add_argument("--no-llama", dest="llama", action="store_false", help="hybridkv only")
    p.add_argument("--quick", action="store_true", help="LLM only, tiny qwen3, 8 tokens")
    p.add_argument("--cache-dir", type=Path, default=None, help="--quick's checkpoint")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: LLM engines only, tokens per second of CPU time (--threads 1)")  # fmt: skip
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:
        return worker(args.worker, args.threads, args.clock == "cpu")
    if args.quick:
        args.gguf, args.llama, args.repeats = [quick_model(args.cache_dir)], False, 1
        args.decode_tokens, args.threads = 8, 1
    if not args.gguf:
        p.error("--gguf FILE... (or --quick)")
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu times one thread: --threads 1")
    if args.llama and not (args.llama_bin / "llama-server").exists():
        p.error(f"no llama-server in {args.llama_bin} (setup_llamacpp_baseline.sh; or --no-llama)")
    results = {path.name: bench_file(path, args) for path in args.gguf}
    doc = {
        "benchmark": "single_stream",
        "machine": machine_info(cpu_flags=cpu_flags()),
        "threads": args.threads,
        "clock": args.clock,
        "decode_tokens": args.decode_tokens,
        "results": results,
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 13 — prefill with state checkpoints due inside it, on the small Granite 4.0-H.

One prompt of ``--prompt-len`` fresh random tokens (never a prefix hit), prefilled in one step
(``max_num_batched_tokens`` = the prompt), then one token. Modes, run alternately after one
warm-up run of each::

    off      prefix caching off: no state saved at all
    none     caching on, no periodic boundary: only the prompt's end is due (the baseline)
    scan     caching on, a boundary due every --every tokens, states taken from the scan
    split    the same boundaries by split steps (the engine before issue 13), optional

The target: ``scan`` within 1.05x of ``none``. Prints one JSON document on stdout and a table
on stderr, with the machine, CPU flags and load average.

    .venv/bin/python benchmarks/checkpoint_prefill.py              # 4032 tokens, every 64
    .venv/bin/python benchmarks/checkpoint_prefill.py --quick      # seconds: tiny checkpoint
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import machine_info
from hybridkv.paths import cache_dir as hybridkv_cache_dir

MODES = ("off", "none", "scan", "split")


def make_llm(path: Path, mode: str, every: int, prompt_len: int, slots: int) -> Any:
    from hybridkv import LLM

    llm = LLM(
        str(path),
        dtype="float32",
        enable_prefix_caching=mode != "off",
        state_checkpoint_interval=0 if mode in ("off", "none") else every,
        max_num_batched_tokens=prompt_len,
        max_num_seqs=1,
        max_model_len=prompt_len + 8,
        kv_cache_memory="1GiB" if prompt_len > 1024 else "256MiB",  # zeroed at start
        num_state_slots=slots,
        state_checkpoint_budget=1.0,
    )
    if mode == "split":  # the engine as it was: steps end at every due boundary
        kv = llm.engine.kv
        kv.config = dataclasses.replace(kv.config, states_from_scan=False)
    return llm


def run_once(llm: Any, prompt: list[int]) -> tuple[float, int]:
    """Seconds to prefill ``prompt`` and sample one token; state saves of that request."""
    from hybridkv import SamplingParams

    saves = 0
    step = llm.engine.runner.execute

    def counting(out: Any) -> Any:
        nonlocal saves
        saves += len(out.state_saves)
        return step(out)

    llm.engine.runner.execute = counting
    start = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)
    elapsed = time.perf_counter() - start
    llm.engine.runner.execute = step
    return elapsed, saves


def cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    return sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "sse4")))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompt-len", type=int, default=4032)
    p.add_argument("--every", type=int, default=64, help="tokens between due boundaries")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=list(MODES[:3]), choices=MODES)
    p.add_argument("--size", default="small", choices=["tiny", "small"])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--cache-dir", type=Path, default=None, help="checkpoints (built if missing)")
    p.add_argument("--quick", action="store_true", help="tiny checkpoint, 512 tokens, 1 run")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.prompt_len, args.repeats = "tiny", 512, 1
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from hybridkv.model.loading.make_model import ensure_model

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cache_dir = args.cache_dir or hybridkv_cache_dir() / "bench-checkpoints"
    path = cache_dir / f"granitemoehybrid-{args.size}"
    ensure_model("granitemoehybrid", path, size=args.size, seed=0)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    slots = args.prompt_len // args.every + 8
    engines = {m: make_llm(path, m, args.every, args.prompt_len, slots) for m in args.modes}
    times: dict[str, list[float]] = {m: [] for m in args.modes}
    saves: dict[str, int] = {}
    for rep in range(args.repeats + 1):  # the first round warms up
        for mode, llm in engines.items():
            prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_len)]
            elapsed, saves[mode] = run_once(llm, prompt)
            if rep:
                times[mode].append(elapsed)
    result: dict[str, Any] = {
        "machine": machine_info(cpu_flags=cpu_flags(), load_average=os.getloadavg()),
        "benchmark": "checkpoint_prefill",
        "quick": args.quick,
        "size": args.size,
        "prompt_len": args.prompt_len,
        "every": args.every,
        "state_saves": saves,
        "seconds": {m: {"median": statistics.median(t), "min": min(t)} for m, t in times.items()},
    }
    if "none" in times:
        base = statistics.median(times["none"])
        result["ratio_to_none"] = {m: statistics.median(t) / base for m, t in times.items()}
    print(json.dumps(result, indent=2))
    for mode in args.modes:
        med = result["seconds"][mode]["median"]
        ratio = result.get("ratio_to_none", {}).get(mode, float("nan"))
        print(f"{mode:6} {med:8.3f} s  x{ratio:5.3f}  saves {saves[mode]}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()

"""Where one engine step's time goes: a decode step and a prefill step, split by part.

Builds hybridkv's ``EngineCore`` on a B1 checkpoint, adds ``--batch`` requests of
``--prompt-len`` random tokens, and times engine steps with timers wrapped around the parts:

- ``schedule`` / ``update``: the scheduler before and after the forward pass;
- ``build_step``: step metadata (``model/step/step_builder.py``);
- ``gemm``: every ``F.linear`` and projection GEMM (``ProjectionGemm``: projections, experts,
  lm_head; the native skinny GEMM at decode rows) — the matmul floor's part;
- ``attention``: ``PagedAttention.forward`` (page writes, gather/mask or the native kernel);
- ``sampler``: ``Sampler.sample``;
- ``forward other``: the rest of the model (norms, rotary, activations, embedding, Mamba2...,
  and ``compute_logits`` outside its lm_head GEMM);
- ``engine other``: the rest of the step (runner bookkeeping, outputs, detokenizing);
- ``engine``: everything outside the model (schedule + build_step + sampler + update + engine
  other), issue 17's "non-GEMM engine overhead".

- ``native``: time inside the C kernels (every ctypes call of ``hybridkv.native``: projections,
  attention, norms, Mamba2...), overlapping the parts above; ``glue`` = step - native: the
  Python and small torch ops around them, what a compiled decode step would remove.

``--gguf FILE...`` profiles those model files (e.g. llama.cpp's GGUF) instead of the B1
checkpoints; single-stream decode: ``--gguf F --batch 1 --prompt-len 16 --threads 1``.

The prefill step is the first step (every prompt at once); decode steps follow, medians of
``--steps``. Timers nest, so each part is its own time minus nothing: GEMMs inside attention
layers' projections are counted under ``gemm`` only (projections are outside ``PagedAttention``).

    .venv/bin/python benchmarks/step_profile.py --threads 1 --sizes tiny small --archs qwen3
    HYBRIDKV_NATIVE=0 .venv/bin/python benchmarks/step_profile.py --threads 1   # torch path

``--quick``: seconds, run by the tests. ``--clock cpu`` (default) times this thread's CPU time, which another job on the machine barely
changes; it needs ``--threads 1`` (other threads' work would be missed).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from throughput import FIRST_TOKEN_ID, add_case_args, b1_machine, make_llm, run_cases

PARTS = ("schedule", "build_step", "gemm", "attention", "sampler", "update")


class Timers:
    """Accumulated seconds per part over the current step, on ``clock``."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self.inside: set[str] = set()  # parts being timed: a nested call is not counted twice

    def wrap(self, owner: Any, attr: str, part: str) -> Callable[[], None]:
        """Time ``owner.attr`` under ``part``; returns the undo."""
        original = getattr(owner, attr)
        timers = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if part in timers.inside:
                return original(*args, **kwargs)
            timers.inside.add(part)
            began = timers.clock()
            try:
                return original(*args, **kwargs)
            finally:
                timers.seconds[part] += timers.clock() - began
                timers.inside.discard(part)

        setattr(owner, attr, timed)
        return lambda: setattr(owner, attr, original)


@contextmanager
def instrumented(llm: Any, timers: Timers) -> Iterator[None]:
    from hybridkv.model.layers.attention import PagedAttention
    from hybridkv.model.layers.linear import ProjectionGemm
    from hybridkv.model.step import runner as runner_module

    engine = llm.engine
    undo = [
        timers.wrap(engine.scheduler, "schedule", "schedule"),
        timers.wrap(engine.scheduler, "update_from_output", "update"),
        # step metadata: the runner's decode-input reuse (model/step/decode_reuse.py) or,
        # in older trees, build_step itself
        timers.wrap(engine.runner.step_inputs, "build", "build_step")
        if hasattr(engine.runner, "step_inputs")
        else timers.wrap(runner_module, "build_step", "build_step"),
        timers.wrap(torch.nn.functional, "linear", "gemm"),
        timers.wrap(ProjectionGemm, "__call__", "gemm"),
        timers.wrap(PagedAttention, "forward", "attention"),
        timers.wrap(engine.runner.sampler, "sample", "sampler"),
        timers.wrap(engine.runner.model, "forward", "forward"),
        # the final norm and lm_head run outside forward(): model work, not engine overhead
        timers.wrap(engine.runner.model, "compute_logits", "forward"),
    ]
    if hasattr(engine.runner, "decode_program"):  # a compiled decode step instead of forward()
        undo.append(timers.wrap(engine.runner.decode_program, "try_forward", "forward"))
    undo += [timers.wrap(lib, attr, "native") for lib, attr in native_entry_points()]
    try:
        yield
    finally:
        for fn in reversed(undo):
            fn()


def native_entry_points() -> list[tuple[Any, str]]:
    """(kernel object, attribute) of every ctypes function a forward pass may call."""
    from hybridkv.native.attention import load_attention
    from hybridkv.native.gemm import load_gemm
    from hybridkv.native.quant import load_quant
    from hybridkv.native.rownorm import load_rownorm
    from hybridkv.native.runner import load_runner
    from hybridkv.native.ssm import load_ssm
    from hybridkv.native.ssm_prefill import load_ssm_prefill

    names = ("_attn", "_gemm", "_gemm_i8", "_dequantize", "_norm", "_rope", "_norm_rope",
             "_act_mul", "_step", "_conv", "_scan", "_run")  # fmt: skip
    libs = [load() for load in (load_attention, load_gemm, load_quant, load_rownorm, load_ssm,
                                load_ssm_prefill, load_runner)]  # fmt: skip
    return [(lib, n) for lib in libs if lib is not None for n in names if hasattr(lib, n)]


def split(step_s: float, parts: dict[str, float]) -> dict[str, float]:
    """Milliseconds per part, with ``forward other`` and ``engine other`` as remainders."""
    ms = {p: parts.get(p, 0.0) * 1e3 for p in PARTS}
    forward = parts.get("forward", 0.0) * 1e3
    ms["forward other"] = forward - ms["gemm"] - ms["attention"]
    ms["engine other"] = (
        step_s * 1e3 - forward - sum(ms[p] for p in ("schedule", "build_step", "sampler", "update"))
    )
    ms["step"] = step_s * 1e3
    ms["native"] = parts.get("native", 0.0) * 1e3
    ms["glue"] = ms["step"] - ms["native"]
    ms["non-GEMM"] = ms["step"] - ms["gemm"]
    # everything outside the model: the "non-GEMM engine overhead" of issue 17
    ms["engine"] = ms["step"] - forward
    return ms


def profile_case(path: Path, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    from hybridkv import SamplingParams
    from hybridkv.model.loading.hub import resolve_model_dir

    vocab = json.loads((resolve_model_dir(str(path)) / "config.json").read_text())["vocab_size"]
    limits = {"max_model_len": 4096} if args.gguf else {}
    llm = make_llm(path, dtype, max_num_seqs=args.batch, max_num_batched_tokens=8192, **limits)
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=args.steps + 8, ignore_eos=True)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    outputs = getattr(llm.engine, "outputs", None)  # older engines build every output
    if outputs is not None:
        outputs.final_only = args.outputs == "final"
    result: dict[str, Any] = {}
    for rnd in range(2):  # round 0 warms up
        for _ in range(args.batch):
            prompt = [rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(args.prompt_len)]
            llm.engine.add_request(prompt, params)
        steps: list[dict[str, float]] = []
        timers = Timers(clock)
        with instrumented(llm, timers):
            while llm.engine.has_unfinished_requests():
                timers.seconds.clear()
                began = clock()
                llm.engine.step()
                steps.append(split(clock() - began, timers.seconds))
        if rnd == 1:
            decode = steps[1 : 1 + args.steps]
            result["prefill_ms"] = steps[0]
            result["decode_ms"] = {k: statistics.median(s[k] for s in decode) for k in decode[0]}
    if not args.gguf:  # (quantized weights: the projections' floor is quant_decode.py's)
        result["decode_floor"] = decode_floor(llm.engine.runner.model, args.batch, clock)
    print_case(result)
    return result


def decode_floor(model: Any, rows: int, clock: Callable[[], float]) -> dict[str, float]:
    """The GEMM floor of a decode step (``matmul_floor.py``'s, same run, same clock): every
    projection at ``rows`` rows through ``F.linear`` and through hybridkv's ProjectionGemm, best of 5;
    the median decode step over each."""
    from matmul_floor import time_rows, weights_of

    weights, head = weights_of(model)
    floor: dict[str, float] = {}
    with torch.inference_mode():
        for name, ours in (("f_linear", False), ("hybridkv", True)):
            best = min(time_rows(weights, head, rows, rows, ours, clock) for _ in range(5))
            floor[f"{name}_ms"] = best * 1e3
    return floor


def print_case(result: dict[str, Any]) -> None:
    names = list(result["prefill_ms"])
    print(f"{'part':<16}{'prefill ms':>12}{'decode ms':>12}", file=sys.stderr)
    for name in names:
        pre, dec = result["prefill_ms"][name], result["decode_ms"][name]
        print(f"{name:<16}{pre:>12.3f}{dec:>12.3f}", file=sys.stderr)
    step = result["decode_ms"]["step"]
    for name, ms in result.get("decode_floor", {}).items():
        print(f"decode floor {name} {ms:.3f} ms: step / floor {step / ms:.3f}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="qwen3 tiny, 4 short requests, 3 steps")
    add_case_args(p, dtypes=["float32"])
    p.add_argument("--gguf", nargs="+", type=Path, default=[], help="model files to profile")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default="cpu",
        help="cpu: this thread's CPU time (steady on a shared machine; use --threads 1)",
    )
    p.add_argument(
        "--outputs",
        choices=["final", "every"],
        default="final",
        help="final: outputs for finished requests only, as LLM.generate runs the engine; "
        "every: one per request per step, as the server's streaming does",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.archs, args.batch, args.prompt_len, args.steps = (
            ["tiny"],
            ["qwen3"],
            4,
            16,
            3,
        )
        args.threads = 1
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu counts one thread's time: use it with --threads 1")
    torch.set_num_threads(args.threads)
    if args.gguf:
        results = {f.name: profile_case(f, "float32", args) for f in args.gguf}
    else:
        results = run_cases(args, lambda path, dtype: profile_case(path, dtype, args))
    doc = {"benchmark": "step_profile", "machine": b1_machine(), "results": results}
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

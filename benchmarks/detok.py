"""Per-step engine overhead over a long output: decoding cost must not grow with its length.

One greedy request generates ``--tokens`` tokens (eos ignored) on a tiny checkpoint. Every step
is timed, and so is the model runner's part of it; the engine's own per-step overhead is the
difference (scheduling, KV bookkeeping, detokenizing, stop strings, outputs); the text path
(detokenize + stop strings) is also timed alone. The report gives medians per block of ``--bucket`` output tokens, first to last: flat means each step costs the
same at token 4,000 as at token 100. ``--baseline`` also runs the pre-issue-16 text path (the
whole output re-decoded and searched for stop strings every step) for comparison.

    .venv/bin/python benchmarks/detok.py --baseline            # 4,000 tokens
    .venv/bin/python benchmarks/detok.py --quick               # seconds; run by the tests
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_common import machine_info


class FullDecode:
    """The text path before the incremental detokenizer: decode everything, every step."""

    def __init__(self, decoder: Any, stop: Sequence[str] = (), **options: bool) -> None:
        self._decoder, self._stop = decoder, tuple(stop)
        self._skip_special = options.get("skip_special_tokens", True)
        self._ids: list[int] = []
        self.text, self.stop_string = "", None

    @property
    def has_stop_strings(self) -> bool:
        return bool(self._stop)

    @property
    def num_tokens(self) -> int:
        return len(self._ids)

    def update(self, new_ids: Sequence[int], check_stop: bool = True) -> str | None:
        self._ids.extend(new_ids)
        self.text = self._decoder.decode(self._ids, skip_special_tokens=self._skip_special)
        for stop in self._stop if check_stop else ():
            at = self.text.find(stop)
            if at != -1:
                self.text, self.stop_string = self.text[:at], stop
                return stop
        return None

    def stable_length(self, finished: bool) -> int:
        return len(self.text)


def run(model: Path, tokens: int, bucket: int, full_decode: bool) -> dict[str, Any]:
    from hybridkv import LLM, SamplingParams
    from hybridkv.engine import core

    if full_decode:
        core.IncrementalDetokenizer = FullDecode  # type: ignore[misc, assignment]
    llm = LLM(str(model), max_model_len=tokens + 16, kv_cache_memory="256MiB")
    engine = llm.engine
    forward: list[float] = []
    execute = engine.runner.execute

    def timed_execute(out: Any) -> Any:
        began = time.perf_counter()
        result = execute(out)
        forward.append(time.perf_counter() - began)
        return result

    engine.runner.execute = timed_execute  # type: ignore[method-assign]
    text: list[float] = []  # the text path alone: detokenize + stop strings
    apply_stops = engine.outputs.apply_stop_strings

    def timed_text(req: Any, state: Any) -> None:
        began = time.perf_counter()
        apply_stops(req, state)
        text.append(time.perf_counter() - began)

    engine.outputs.apply_stop_strings = timed_text  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True, stop=("never!",))
    engine.add_request(list(range(3, 11)), params)
    overhead: list[float] = []
    while engine.has_unfinished_requests():
        n = len(forward)
        began = time.perf_counter()
        engine.step()
        spent = time.perf_counter() - began
        overhead.append(spent - (forward[-1] if len(forward) > n else 0.0))
    engine.shutdown()
    steps, texts = _medians(overhead[1:], bucket), _medians(text[1:], bucket)  # [0]: prefill
    return {
        "steps": len(overhead),
        "overhead_us_per_bucket": steps,
        "overhead_last_over_first": round(steps[-1] / steps[0], 2),
        "text_us_per_bucket": texts,
        "text_last_over_first": round(texts[-1] / texts[0], 2),
        "forward_ms_mean": round(statistics.fmean(forward) * 1e3, 2),
    }


def _medians(seconds: list[float], bucket: int) -> list[float]:
    """Median microseconds per block of ``bucket`` steps (medians: the machine may be shared)."""
    blocks = [seconds[i : i + bucket] for i in range(0, len(seconds), bucket)]
    return [round(statistics.median(b) * 1e6, 1) for b in blocks]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="200 tokens")
    p.add_argument("--tokens", type=int, default=4000)
    p.add_argument("--bucket", type=int, default=500, help="output tokens per reported mean")
    p.add_argument("--baseline", action="store_true", help="also run the full re-decode path")
    p.add_argument("--cache-dir", type=Path, default=None, help="where the checkpoint is built")
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.bucket = 200, 50
    from hybridkv.model.loading.make_model import ensure_model
    from hybridkv.paths import cache_dir

    model = (args.cache_dir or cache_dir() / "bench-checkpoints") / "granitemoehybrid-tiny"
    ensure_model("granitemoehybrid", model, size="tiny", seed=0)
    print(f"detok: {args.tokens} tokens on {model}", file=sys.stderr)
    results = {"incremental": run(model, args.tokens, args.bucket, full_decode=False)}
    if args.baseline:
        results["full_decode"] = run(model, args.tokens, args.bucket, full_decode=True)
    report = {"benchmark": "detok", "quick": args.quick, "tokens": args.tokens,
              "bucket": args.bucket, "machine": machine_info(), "results": results}  # fmt: skip
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""B7 — KV-aware routing: N ``hybridkv serve`` engines behind ``hybridkv proxy``, B3's chat
trace replayed for each ``--routing`` policy.

The engines (the embedded tiny hybrid, or ``--model``: a full-attention group and a Mamba2
state group) run once with KV events on and a small ``--kv-cache-memory`` (eviction
happens); before each policy every engine's prefix cache is reset and a fresh proxy starts.
The trace is ``prefix_trace_workload.py``'s (24 conversations x 4 turns, shared system
prompts, token ids folded into the model's vocabulary); each conversation sends its turns in
order, ``--concurrency`` requests in flight at most, each turn's message ends as
``cache_boundaries`` (what the chat route passes), streamed with usage, ``--max-tokens``
tokens. A last run, ``single``, sends the whole trace through the proxy to one engine whose
KV memory is the whole fleet's (``--engines`` x ``--kv-memory``): the single-cache floor of
prompt tokens computed (one cache as large as all of them, seeing every request).

Per policy: prompt tokens computed (prompt - cached, from usage), the proxy's prediction
accuracy (predicted == actual cached tokens, from its /metrics), TTFT p50/p90 (first content
event, client side), throughput (requests and prompt tokens per second). One JSON object on
stdout, with the machine and its CPU flags.

    .venv/bin/python benchmarks/routing.py              # 4 engines, the whole trace
    .venv/bin/python benchmarks/routing.py --quick      # 2 engines, 4 x 2 turns
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench_common import cpu_flags, machine_info
from prefix_trace_workload import Turn, make_trace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.e2e_pd.harness import ProxyProcess  # noqa: E402
from tests.server.harness import SubprocessServer  # noqa: E402

POLICIES = ("round_robin", "cache", "cost")
TINY_VOCAB = 1024  # the embedded tiny model's


def resolve_model(name: str | None) -> tuple[str | None, int]:
    """``--model``: a checkpoint directory, or a make-model ``arch-size`` name (built once
    under the bench-checkpoints cache); returns it and its vocabulary size."""
    if name is None:
        return None, TINY_VOCAB
    path = Path(name)
    if not path.exists():
        from hybridkv.model.loading.make_model import ensure_model
        from hybridkv.paths import cache_dir

        arch, _, size = name.rpartition("-")
        path = cache_dir() / "bench-checkpoints" / name
        ensure_model(arch, path, size=size, seed=0)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    return str(path), min(vocab, 32000)


def engine_args(
    args: argparse.Namespace, tmp: Path, i: int, kv_memory: str | None = None
) -> list[str]:
    events = {"enable_kv_cache_events": True, "endpoint": f"ipc://{tmp}/ev{i}",
              "replay_endpoint": f"ipc://{tmp}/rp{i}", "topic": "kv"}  # fmt: skip
    model = ["--model", args.model] if args.model else []
    return [*model, "--served-model-name", "m", "--kv-cache-memory", kv_memory or args.kv_memory,
            "--max-num-seqs", "4", "--kv-events-config", json.dumps(events),
            # a step of a small model on a loaded machine can take a minute: not a stall
            "--engine-stall-seconds", "600"]  # fmt: skip


async def one_turn(
    client: httpx.AsyncClient, url: str, turn: Turn, max_tokens: int, vocab: int
) -> dict[str, Any]:
    prompt = [3 + t % (vocab - 3) for t in turn.prompt]
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True},
            "cache_boundaries": list(turn.message_ends)}  # fmt: skip
    start = time.perf_counter()
    ttft, cached = None, None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if ttft is None and event.get("choices"):
                ttft = time.perf_counter() - start
            usage = event.get("usage")
            if usage:
                cached = usage["prompt_tokens_details"]["cached_tokens"]
    return {"prompt": len(prompt), "cached": cached or 0, "ttft": ttft or 0.0}


async def replay(
    url: str, trace: list[Turn], concurrency: int, max_tokens: int, vocab: int
) -> dict[str, Any]:
    gate = asyncio.Semaphore(concurrency)
    by_conversation: dict[int, list[Turn]] = {}
    for turn in trace:
        by_conversation.setdefault(turn.conversation, []).append(turn)
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600)) as client:

        async def conversation(turns: list[Turn]) -> None:
            for turn in turns:  # a turn follows its predecessor's answer
                async with gate:
                    rows.append(await one_turn(client, url, turn, max_tokens, vocab))

        start = time.perf_counter()
        await asyncio.gather(*(conversation(t) for t in by_conversation.values()))
        wall = time.perf_counter() - start
    return summarize(rows, wall)


def summarize(rows: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ttfts = sorted(r["ttft"] for r in rows)
    prompt = sum(r["prompt"] for r in rows)
    return {
        "requests": len(rows),
        "prompt_tokens": prompt,
        "computed_tokens": prompt - sum(r["cached"] for r in rows),
        "ttft_p50": ttfts[len(ttfts) // 2],
        "ttft_p90": ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))],
        "wall_s": wall,
        "requests_per_s": len(rows) / wall,
        "prompt_tokens_per_s": prompt / wall,
    }


def proxy_counts(text: str, family: str) -> dict[str, int]:
    """A proxy counter's samples summed by their ``result`` label."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith(family + "{"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            out[result] = out.get(result, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def proxy_values(text: str, prefix: str) -> dict[str, float]:
    """The proxy's unlabelled samples whose names start with ``prefix``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix) and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name.removesuffix("_total")] = float(value)
    return out


def run_policy(
    args: argparse.Namespace,
    tmp: Path,
    engines: list[SubprocessServer],
    policy: str,
    trace: list[Turn],
) -> dict[str, Any]:
    for e in engines:
        assert httpx.post(e.url + "/reset_prefix_cache", timeout=60).status_code == 200
    proxy = ProxyProcess([], [e.url for e in engines], tmp / f"proxy-{policy}.log")
    name, _, wait = policy.partition(":")  # e.g. cost:landed (--prefill-wait landed)
    proxy.cmd += ["--routing", "cost" if name == "single" else name]
    proxy.cmd += ["--prefill-wait", wait or "auto"]
    # a loaded machine's engines answer /health slowly; one judged down loses its index
    proxy.cmd += ["--health-timeout", "60", "--first-byte-timeout", "3600"]
    with proxy:
        time.sleep(3.0)  # the subscribers connect (a late start is replayed anyway)
        result = asyncio.run(
            replay(proxy.url, trace, args.concurrency, args.max_tokens, args.vocab)
        )
        text = httpx.get(proxy.url + "/metrics", timeout=10).text
        result["health_probes"] = proxy_counts(text, "hybridkv_proxy_health_probes_total")
        if policy != "single":
            found = proxy_counts(text, "hybridkv_proxy_predictions_total")
            result["predictions"] = {"exact": 0, "over": 0, "under": 0, **found}
            seen = sum(result["predictions"].values())
            result["prediction_accuracy"] = result["predictions"]["exact"] / max(1, seen)
            from routing_misses import classify  # it imports this module

            records = httpx.get(proxy.url + "/v1/routing/predictions", timeout=10).json()
            result["misses"] = classify(records["predictions"])
            if args.log_dir is not None:  # every record, for a closer look (routing_misses.py)
                (args.log_dir / f"predictions-{policy}.json").write_text(json.dumps(records))
            result["settle"] = {k.removeprefix("hybridkv_proxy_settle_"): v
                                for k, v in proxy_values(text, "hybridkv_proxy_settle_").items()}  # fmt: skip
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 engines, 4 conversations x 2 turns")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--kv-memory", default="48MiB")
    p.add_argument("--model", default=None,
                   help="a checkpoint directory or a make-model name such as "
                        "granitemoehybrid-small (default: the embedded tiny hybrid)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=1, help="policies alternate, round by round")
    p.add_argument("--policies", nargs="+", default=[*POLICIES, "single"],
                   help="policy[:prefill-wait], e.g. cost:landed for --prefill-wait landed")  # fmt: skip
    p.add_argument("--log-dir", type=Path, default=None, help="keep the engines' logs here")
    args = p.parse_args(argv)
    if args.quick:
        args.engines, args.conversations, args.turns, args.concurrency = 2, 4, 2, 4
    args.model, args.vocab = resolve_model(args.model)
    return args


def run_rounds(args: argparse.Namespace, tmp: Path) -> dict[str, list[dict[str, Any]]]:
    """Every policy once per round, in order, on the same engines (caches reset each time)."""
    trace = make_trace(args.conversations, args.turns)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in args.policies}
    with ExitStack() as stack:
        engines = [SubprocessServer(engine_args(args, tmp, i), tmp / f"e{i}.log", timeout=600)
                   for i in range(args.engines)]  # fmt: skip
        for e in engines:  # NOTE: from this thread: an engine dies with its starting thread
            stack.enter_context(e)
        single: list[SubprocessServer] = []  # started when first used
        for r in range(args.rounds):
            for policy in args.policies:
                if policy == "single" and not single:
                    single.append(stack.enter_context(single_engine(args, tmp)))
                fleet = single if policy == "single" else engines
                runs[policy].append(run_policy(args, tmp, fleet, policy, trace))
                print(f"round {r} {policy}: {json.dumps(runs[policy][-1])}", file=sys.stderr)
    return runs


def single_engine(args: argparse.Namespace, tmp: Path) -> SubprocessServer:
    """The floor's engine: the fleet's KV memory in one cache."""
    from hybridkv.paths import parse_bytes

    memory = str(args.engines * parse_bytes(args.kv_memory, "--kv-memory"))
    cmd = engine_args(args, tmp, args.engines, memory)
    return SubprocessServer(cmd, tmp / "single.log", timeout=600)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median computed tokens, with every run's tokens and TTFT p90 beside it."""
    ordered = sorted(runs, key=lambda r: r["computed_tokens"])
    out = dict(ordered[len(ordered) // 2])
    out["computed_tokens_runs"] = [r["computed_tokens"] for r in runs]
    out["ttft_p90_runs"] = [round(r["ttft_p90"], 4) for r in runs]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="routing-bench-") as name:
        tmp = args.log_dir or Path(name)
        tmp.mkdir(parents=True, exist_ok=True)
        runs = run_rounds(args, tmp)
    results = {policy: median_run(r) for policy, r in runs.items()}
    rr, single = results.get("round_robin"), results.get("single")
    for r in results.values():
        if rr is not None:
            r["computed_vs_round_robin"] = r["computed_tokens"] / max(1, rr["computed_tokens"])
            r["ttft_p90_vs_round_robin"] = r["ttft_p90"] / max(1e-9, rr["ttft_p90"])
        if single is not None:
            r["computed_vs_single"] = r["computed_tokens"] / max(1, single["computed_tokens"])
    report = {
        "benchmark": "routing",
        "quick": args.quick,
        "config": {k: str(v) for k, v in vars(args).items() if k != "quick"},
        "machine": machine_info(
            cpu_flags=cpu_flags(), loadavg_before=load_before, loadavg=os.getloadavg()
        ),
        "results": results,
    }
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()

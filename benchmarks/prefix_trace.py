"""B3 — prefix caching on a chat trace: hybridkv's KV control plane against vLLM 0.32's.

The trace (``prefix_trace_workload.py``): system prompts of 64-2,000 tokens, a shared
few-shot block, multi-turn conversations interleaved round robin, replies decoded token by
token. Every request runs through hybridkv's ``KVCacheCoordinator`` as the engine drives it
(hit search, one prefill step with states taken from the scan, decode, free), one at a time,
on the small Granite 4.0-H checkpoint's layout and the qwen35-like layout of
``kv_workload.py``, with ``state_checkpoint_budget`` 10 % of the simulated KV memory. Modes::

    off        prefix caching off: every prompt token is computed
    before     caching on, checkpoints at the periodic interval (512), prompt ends, junctions
               and a finished request's last boundary (the engine before issue 13)
    messages   the same plus every message's end (what LLM.chat and the server add)

With ``--vllm PYTHON`` the same token trace also runs through vLLM's own Scheduler and
KVCacheManager (``prefix_trace_vllm.py``, a subprocess in vLLM's virtualenv, same KV memory,
Mamba "align" mode), once with vLLM's default hash granularity and once with
``prefix_match_unit=16`` (its finest hits). TTFT through the real engine:
``prefix_trace_ttft.py``.

The checkpoint policy against the offline optimum (``checkpoint_oracle.py``, issue 29):
three traces (the chat trace; a re-sent batch, 32 prompts twice then 64 twice; an agentic
trace on a shared 2,000-token preamble), each at 1/4, 1 and 4 times the default budget;
hybridkv's saved prompt tokens over the oracle's (``policy_vs_oracle`` in the JSON); with
``--vllm``, vLLM's manager on each trace too (``vllm_saved_tokens``, ``vllm_ratio``).

    .venv/bin/python benchmarks/prefix_trace.py --vllm /work/vllm-venv/bin/python
    .venv/bin/python benchmarks/prefix_trace.py --quick    # seconds, no vLLM
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_common import cpu_flags, machine_info
from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator
from hybridkv.kv.hashing import BlockHash, BlockHasher, get_hash_fn
from hybridkv.kv.spec import FullAttentionSpec, KVCacheLayout, LayerSpec, StateSpec, create_layout
from kv_core import build_layout
from prefix_trace_workload import (
    Turn,
    first_sharer_reuse,
    ideal_hits,
    make_agentic_trace,
    make_resend_trace,
    make_trace,
)

BLOCK = 16
BUDGET = 0.1
MODES = ("off", "before", "messages")
HERE = Path(__file__).resolve().parent


def granite_small_layout() -> KVCacheLayout:
    """The small Granite 4.0-H checkpoint's cache layers (make_model --size small): 9 Mamba2
    layers (conv 1664 x 3, SSM 24 x 64 x 64, float32) and 3 full attention (4 x 64, float32)."""
    mamba = StateSpec("mamba2", ((1664, 3), (24, 64, 64)), ("float32", "float32"))
    full = FullAttentionSpec(BLOCK, 4, 64, "float32")
    specs: list[LayerSpec | None] = [mamba, mamba, mamba, full] * 3
    return create_layout(specs, block_size=BLOCK)


@dataclass
class TraceRequest:
    """The KVRequest protocol over a token list (a turn: prompt, then its reply)."""

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    cache_boundaries: tuple[int, ...]
    num_computed_tokens: int = 0
    block_hashes: list[BlockHash] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def make_coordinator(
    layout: KVCacheLayout,
    mode: str,
    memory: int,
    budget: float = BUDGET,
    *,
    max_blocks: int | None = None,
) -> KVCacheCoordinator:
    """``max_blocks`` caps the attention pool (``--quick``: ``blocks_touched``), nothing else:
    the checkpoint budget and state slots still come from ``memory``."""
    from hybridkv.engine.sizing import checkpoint_capacity

    cap = checkpoint_capacity(budget, memory, layout)
    slots = 3 + (cap or 0) if layout.state_group_ids else 0
    num_blocks = layout.num_blocks_for(memory, slots)
    config = KVCacheConfig(
        num_blocks=num_blocks if max_blocks is None else min(num_blocks, max_blocks),
        num_state_slots=slots,
        enable_prefix_caching=mode != "off",
        enable_kv_cache_events=False,
        max_checkpoints=cap,
        states_from_scan=True,
    )
    return KVCacheCoordinator(layout, config)


def serve(coord: KVCacheCoordinator, req: TraceRequest, reply: list[int]) -> tuple[int, ...]:
    """One turn as the engine runs it; returns (its hit, each group's own hit)."""
    hit = coord.find_cache_hit(req)
    assert coord.allocate(req, req.num_prompt_tokens - hit.num_tokens, hit), "pool too small"
    req.num_computed_tokens = req.num_prompt_tokens
    coord.take_state_copies()
    coord.cache(req, req.num_computed_tokens)
    coord.end_step()
    decode(coord, req, reply)
    return (hit.num_tokens, *(hit.group_hit_tokens or [0] * len(coord.layout.groups)))


def decode(coord: KVCacheCoordinator, req: TraceRequest, reply: list[int]) -> None:
    hasher = BlockHasher(BLOCK, get_hash_fn("sha256"))
    for token in reply[:-1]:  # the last reply token is sampled, never computed
        req.token_ids.append(token)
        hasher.extend(req.block_hashes, req.token_ids)
        assert coord.allocate(req, 1)
        req.num_computed_tokens += 1
        coord.take_state_copies()
        coord.cache(req, req.num_computed_tokens)
        coord.end_step()
    coord.free(req)


def blocks_touched(turns: list[Turn], layout: KVCacheLayout) -> int:
    """Blocks a run of ``turns`` could hold at once if nothing were ever evicted (every prompt
    and reply token of every turn cached, per attention group), plus the null block: a pool
    this big never evicts, so a run on it gives the same hits as on the full ``memory`` pool
    while ``check_integrity`` (after every turn) walks a few thousand blocks, not ~10^5."""
    per_group = sum(-(-(len(t.prompt) + len(t.reply)) // BLOCK) for t in turns)
    return 1 + per_group * max(1, len(layout.attention_group_ids))


def run(
    layout_name: str,
    mode: str,
    turns: list[Turn],
    memory: int,
    budget: float = BUDGET,
    quick: bool = False,
) -> dict[str, Any]:
    """``quick``: the attention pool capped at ``blocks_touched`` (the same hits, less to check)."""
    layout = granite_small_layout() if layout_name == "granite_small" else build_layout(layout_name)
    cap = blocks_touched(turns, layout) if quick else None
    coord = make_coordinator(layout, mode, memory, budget, max_blocks=cap)
    hits: list[int] = []
    group_hits = [0] * len(layout.groups)
    peak = 0
    for i, turn in enumerate(turns):
        bounds = turn.message_ends if mode == "messages" else ()
        req = TraceRequest(f"r{i}", list(turn.prompt), len(turn.prompt), bounds)
        BlockHasher(BLOCK, get_hash_fn("sha256")).extend(req.block_hashes, req.token_ids)
        hit, *own = serve(coord, req, turn.reply)
        hits.append(hit)
        group_hits = [a + b for a, b in zip(group_hits, own, strict=True)]
        peak = max(peak, max((sm.book.count() for sm in coord.state), default=0))
        coord.check_integrity()
    return summarize(turns, hits, peak * layout.total_state_slot_bytes(), memory) | {
        "group_hit_rate": {
            f"{g.kind.value}:{gid}": n / sum(len(t.prompt) for t in turns)
            for gid, (g, n) in enumerate(zip(layout.groups, group_hits, strict=True))
        },
        "checkpoint_peak": peak,
        "checkpoint_capacity": coord.state[0].book.capacity if coord.state else None,
    }


def summarize(turns: list[Turn], hits: list[int], peak_bytes: int, memory: int) -> dict[str, Any]:
    total = sum(len(t.prompt) for t in turns)
    computed = total - sum(hits)
    return {
        "prompt_tokens": total,
        "computed_tokens": computed,
        "hit_rate": 1 - computed / total,
        "first_sharer_system_reuse": first_sharer_reuse(turns, hits, BLOCK),
        "checkpoint_peak_bytes": peak_bytes,
        "checkpoint_budget_bytes": int(BUDGET * memory),
    }


def vllm_model(layout_name: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """(HF config, layer kinds, dtype arguments) vLLM is given for a layout."""
    if layout_name == "granite_small":
        from hybridkv.model.loading.make_model import model_config_json

        cfg = model_config_json("granitemoehybrid", "small")
        cfg["vocab_size"] = 32000  # the trace's token ids; no weights are ever built
        kinds = ["attention" if t == "attention" else "mamba2" for t in cfg["layer_types"]]
        return cfg, kinds, ["--dtype", "float32"]
    import kv_workload as wl
    import vllm_kv_baseline as kvb

    kinds = ["gdn" if k == "gdn" else "attention" for k in wl.LAYOUTS[layout_name]["layer_kinds"]]
    return (
        kvb._hf_config(layout_name),
        kinds,
        ["--dtype", "bfloat16", "--mamba-ssm-cache-dtype", "float32"],
    )


def run_vllm(
    python: str, layout_name: str, jobs: list[tuple[list[Turn], int | None]], memory: int
) -> list[dict[str, Any]]:
    """Traces through vLLM's Scheduler in its own virtualenv (``prefix_trace_vllm.py``), one
    process for all of them (importing vLLM is the slow part); a job is a trace and vLLM's
    ``prefix_match_unit`` (None: its own)."""
    cfg, kinds, dtype_args = vllm_model(layout_name)
    with tempfile.TemporaryDirectory(prefix="prefix-trace-") as tmp:
        spec, hf = Path(tmp) / "jobs.json", Path(tmp) / "config.json"
        spec.write_text(json.dumps([
            {"trace": [t.to_json() for t in turns], "prefix_match_unit": unit} for turns, unit in jobs
        ]))  # fmt: skip
        hf.write_text(json.dumps(cfg))
        cmd = [python, str(HERE / "prefix_trace_vllm.py"), "--jobs", str(spec)]
        cmd += ["--hf-config", str(hf), "--layer-kinds", ",".join(kinds)]
        cmd += ["--memory", str(memory), *dtype_args]
        env = {**os.environ, "PYTHONPATH": ""}  # never hybridkv's packages in vLLM's venv
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if res.returncode:
        raise RuntimeError(f"vLLM baseline failed:\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout)
    return [
        summarize(turns, run["hits"], 0, memory) | {"vllm": out["vllm"], "config": run["config"]}
        for (turns, _), run in zip(jobs, out["runs"], strict=True)
    ]


VLLM_LABELS = {"vllm_default": None, "vllm_match_unit_16": BLOCK}  # label -> prefix_match_unit


def print_table(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    for name, by_mode in results.items():
        off = by_mode["off"]["computed_tokens"]
        for mode, r in by_mode.items():
            reuse = min(r["first_sharer_system_reuse"].values(), default=0.0)
            print(
                f"{name:14} {mode:17} computed {r['computed_tokens']:7d} "
                f"({r['computed_tokens'] / off:5.1%})  first-sharer min reuse {reuse:5.1%}  "
                f"checkpoints peak {r['checkpoint_peak_bytes'] / 2**20:7.1f} MiB / "
                f"{r['checkpoint_budget_bytes'] / 2**20:.1f}",
                file=sys.stderr,
            )


def policy_traces(quick: bool) -> dict[str, list[Turn]]:
    """The traces the policy is measured on against the oracle (``checkpoint_oracle.py``)."""
    if quick:
        return {"chat": make_trace(8, 2), "resend": make_resend_trace(), "agentic": make_agentic_trace(4, 4)}  # fmt: skip
    return {"chat": make_trace(24, 4), "resend": make_resend_trace(), "agentic": make_agentic_trace()}  # fmt: skip


def policy_vs_oracle(
    name: str, memory: int, quick: bool, vllm: dict[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """hybridkv's saved prompt tokens (``messages`` mode) against the offline optimum's, per
    trace, at 1/4, 1 and 4 times the default budget; with ``vllm`` (its python), vLLM's
    manager on the same trace and KV memory, as it configures itself (no checkpoint budget:
    its states share the pool with attention pages, so one run per trace)."""
    import checkpoint_oracle as oracle

    rows = []
    for trace, turns in policy_traces(quick).items():
        computed = [(t.prompt + t.reply[:-1], len(t.prompt)) for t in turns]
        chains = oracle.chains_of(computed, BLOCK)
        theirs = None
        if vllm:
            theirs = vllm[trace]["prompt_tokens"] - vllm[trace]["computed_tokens"]
        for factor in (1.0,) if quick else (0.25, 1.0, 4.0):
            r = run(name, "messages", turns, memory, BUDGET * factor, quick)
            best = oracle.saved_tokens(chains, r["checkpoint_capacity"] or 0, BLOCK)
            saved = r["prompt_tokens"] - r["computed_tokens"]
            rows.append({
                "layout": name, "trace": trace, "budget_factor": factor,
                "checkpoints": r["checkpoint_capacity"], "prompt_tokens": r["prompt_tokens"],
                "computed_tokens": r["computed_tokens"], "saved_tokens": saved,
                "oracle_saved_tokens": best.saved, "oracle_feasible_tokens": best.feasible,
                "ratio": saved / best.saved if best.saved else 1.0,
                "vllm_saved_tokens": theirs,
                "vllm_ratio": None if theirs is None else theirs / best.saved if best.saved else 1.0,
            })  # fmt: skip
            print(
                f"{name:14} {trace:8} x{factor:<4} {r['checkpoint_capacity']:4d} checkpoints: "
                f"saved {saved:7d}, oracle {best.saved:7d} (feasible {best.feasible:7d}): "
                f"{rows[-1]['ratio']:.3f}",
                file=sys.stderr,
            )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--memory", nargs="+", default=["2GiB", "16GiB"],
                   help="KV memory of the simulated engine, per layout (a qwen35 state is 75 MiB)")  # fmt: skip
    p.add_argument("--layouts", nargs="+", default=["granite_small", "qwen35"])
    p.add_argument("--vllm", metavar="PYTHON", help="vLLM's python: also run vLLM's manager")
    p.add_argument("--quick", action="store_true",
                   help="8 conversations x 2 turns, one budget, the attention pool capped "
                   "where nothing is evicted (blocks_touched)")  # fmt: skip
    args = p.parse_args(argv)
    if args.quick:
        args.conversations, args.turns = 8, 2
    from hybridkv.paths import parse_bytes

    memories = [parse_bytes(m, "--memory") for m in args.memory]
    turns = make_trace(args.conversations, args.turns)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    vllm_policy: dict[str, dict[str, dict[str, Any]] | None] = {}
    for name, memory in zip(args.layouts, memories, strict=True):
        results[name] = {mode: run(name, mode, turns, memory, quick=args.quick) for mode in MODES}
        vllm_policy[name] = None
        if args.vllm:
            labels, policy = VLLM_LABELS, policy_traces(args.quick)
            jobs = [(turns, unit) for unit in labels.values()] + [
                (t, None) for t in policy.values()
            ]
            runs = run_vllm(args.vllm, name, jobs, memory)
            results[name] |= dict(zip(labels, runs[: len(labels)], strict=True))
            vllm_policy[name] = dict(zip(policy, runs[len(labels) :], strict=True))
    floor = summarize(turns, ideal_hits(turns, BLOCK), 0, 1)["computed_tokens"]
    for by_mode in results.values():
        for r in by_mode.values():
            r["above_floor"] = r["computed_tokens"] - floor
    print_table(results)
    print(f"floor (an unbounded cache at every 16-token boundary): {floor}", file=sys.stderr)
    out = {
        "benchmark": "prefix_trace",
        "quick": args.quick,
        "machine": machine_info(cpu_flags=cpu_flags(), load_average=os.getloadavg()),
        "trace": {"conversations": args.conversations, "turns": args.turns, "requests": len(turns)},
        "workload": {"memory": dict(zip(args.layouts, memories, strict=True)), "budget": BUDGET},
        "floor_computed_tokens": floor,
        "results": results,
        "policy_vs_oracle": [
            row
            for name, memory in zip(args.layouts, memories, strict=True)
            for row in policy_vs_oracle(name, memory, args.quick, vllm_policy[name])
        ],
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

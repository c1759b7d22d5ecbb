"""B3 (part) — prefix caching on a chat trace, KV control plane only (no model, no TTFT).

A seeded chat trace: several system prompts (64-2,000 tokens), a shared few-shot block, and
multi-turn conversations interleaved round robin; each turn's prompt is the whole conversation
so far plus a new user message, and its reply (the decoded tokens) is part of the next turn.
Every request runs through hybridkv's ``KVCacheCoordinator`` as the engine drives it (hit
search, one prefill step with states taken from the scan, decode token by token, free), one
at a time, on a Granite-4.0-H-small-like layout and the qwen35-like layout of
``kv_workload.py``. Modes::

    off        prefix caching off: every prompt token is computed
    before     caching on, checkpoints only at the periodic interval (512), prompt ends,
               junctions and a finished request's last boundary (the engine before issue 13)
    messages   the same plus every message's end (what LLM.chat and the server now add)

Reports prompt tokens computed, the hit rate, how much of each system prompt its *first*
sharer reused, and the peak checkpoint memory against ``state_checkpoint_budget`` (10 %).
Not measured here: TTFT, and vLLM's manager on the same trace.

    .venv/bin/python benchmarks/prefix_trace.py            # 24 conversations x 4 turns
    .venv/bin/python benchmarks/prefix_trace.py --quick    # seconds
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from typing import Any

from bench_common import machine_info
from hybridkv.kv.coordinator import KVCacheConfig, KVCacheCoordinator
from hybridkv.kv.hashing import BlockHash, BlockHasher, get_hash_fn
from hybridkv.kv.spec import FullAttentionSpec, KVCacheLayout, LayerSpec, StateSpec, create_layout
from kv_core import build_layout

BLOCK = 16
BUDGET = 0.1
SYSTEM_LENS = (64, 300, 1000, 2000)
FEW_SHOT_LEN = 600
MODES = ("off", "before", "messages")


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


@dataclass(frozen=True)
class Turn:
    conversation: int
    system: int
    prompt: list[int]
    reply: list[int]
    message_ends: tuple[int, ...]


def make_trace(num_conversations: int, num_turns: int, seed: int = 0) -> list[Turn]:
    rng = random.Random(seed)

    def text(n: int) -> list[int]:
        return [rng.randrange(3, 32000) for _ in range(n)]

    systems = [text(n) for n in SYSTEM_LENS]
    few_shot = text(FEW_SHOT_LEN)
    histories: list[tuple[int, list[int], list[int]]] = []
    for c in range(num_conversations):
        s = c % len(systems)
        head = systems[s] + (few_shot if c % 2 else [])
        ends = [len(systems[s])] + ([len(head)] if c % 2 else [])
        histories.append((s, head, ends))
    turns = []
    for _ in range(num_turns):
        for c, (s, tokens, ends) in enumerate(histories):
            prompt = tokens + text(rng.randrange(30, 150))
            reply = text(rng.randrange(20, 80))
            turns.append(Turn(c, s, prompt, reply, (*ends, len(prompt))))
            ends.extend([len(prompt), len(prompt) + len(reply)])
            tokens.extend(prompt[len(tokens) :] + reply)
    return turns


def make_coordinator(layout: KVCacheLayout, mode: str, memory: int) -> KVCacheCoordinator:
    from hybridkv.engine.sizing import checkpoint_capacity

    cap = checkpoint_capacity(BUDGET, memory, layout)
    slots = 3 + (cap or 0) if layout.state_group_ids else 0
    config = KVCacheConfig(
        num_blocks=layout.num_blocks_for(memory, slots),
        num_state_slots=slots,
        enable_prefix_caching=mode != "off",
        enable_kv_cache_events=False,
        max_checkpoints=cap,
        states_from_scan=True,
    )
    return KVCacheCoordinator(layout, config)


def serve(coord: KVCacheCoordinator, req: TraceRequest, reply: list[int]) -> int:
    """One turn as the engine runs it; returns its local hit (prompt tokens not computed)."""
    hit = coord.find_cache_hit(req)
    assert coord.allocate(req, req.num_prompt_tokens - hit.num_tokens, hit), "pool too small"
    req.num_computed_tokens = req.num_prompt_tokens
    coord.take_state_copies()
    coord.cache(req, req.num_computed_tokens)
    coord.end_step()
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
    return hit.num_tokens


def run(layout_name: str, mode: str, turns: list[Turn], memory: int) -> dict[str, Any]:
    layout = granite_small_layout() if layout_name == "granite_small" else build_layout(layout_name)
    coord = make_coordinator(layout, mode, memory)
    computed = total = peak = 0
    first_reuse: dict[int, float] = {}
    seen: set[int] = set()
    for i, turn in enumerate(turns):
        bounds = turn.message_ends if mode == "messages" else ()
        req = TraceRequest(f"r{i}", list(turn.prompt), len(turn.prompt), bounds)
        BlockHasher(BLOCK, get_hash_fn("sha256")).extend(req.block_hashes, req.token_ids)
        hit = serve(coord, req, turn.reply)
        computed += len(turn.prompt) - hit
        total += len(turn.prompt)
        if turn.conversation not in seen:
            seen.add(turn.conversation)
            system_blocks = SYSTEM_LENS[turn.system] // BLOCK * BLOCK
            if turn.conversation >= len(SYSTEM_LENS):  # a later conversation: the first sharer
                first_reuse.setdefault(turn.system, min(hit, system_blocks) / system_blocks)
        peak = max(peak, max((sm.book.count() for sm in coord.state), default=0))
        coord.check_integrity()
    slot_bytes = layout.total_state_slot_bytes()
    return {
        "prompt_tokens": total,
        "computed_tokens": computed,
        "hit_rate": 1 - computed / total,
        "first_sharer_system_reuse": {SYSTEM_LENS[s]: r for s, r in sorted(first_reuse.items())},
        "checkpoint_peak": peak,
        "checkpoint_peak_bytes": peak * slot_bytes,
        "checkpoint_budget_bytes": int(BUDGET * memory),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--conversations", type=int, default=24)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument(
        "--memory",
        nargs="+",
        default=["2GiB", "16GiB"],
        help="KV memory of the simulated engine, per layout (a qwen35 state is 75 MiB)",
    )
    p.add_argument("--layouts", nargs="+", default=["granite_small", "qwen35"])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.conversations, args.turns = 8, 2
    from hybridkv.paths import parse_bytes

    memories = [parse_bytes(m, "--memory") for m in args.memory]
    turns = make_trace(args.conversations, args.turns)
    results = {
        name: {mode: run(name, mode, turns, memory) for mode in MODES}
        for name, memory in zip(args.layouts, memories, strict=True)
    }
    for name, by_mode in results.items():
        off = by_mode["off"]["computed_tokens"]
        for mode, r in by_mode.items():
            reuse = min(r["first_sharer_system_reuse"].values(), default=0.0)
            print(
                f"{name:14} {mode:9} computed {r['computed_tokens']:7d} "
                f"({r['computed_tokens'] / off:5.1%})  first-sharer min reuse {reuse:5.1%}  "
                f"checkpoints peak {r['checkpoint_peak_bytes'] / 2**20:7.1f} MiB / "
                f"{r['checkpoint_budget_bytes'] / 2**20:.1f}",
                file=sys.stderr,
            )
    out = {
        "benchmark": "prefix_trace",
        "quick": args.quick,
        "machine": machine_info(),
        "trace": {"conversations": args.conversations, "turns": args.turns, "requests": len(turns)},
        "workload": {"memory": dict(zip(args.layouts, memories, strict=True)), "budget": BUDGET},
        "results": results,
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

"""B3 with a CPU tier: prompt tokens recomputed when the tier keeps units by LRU, ARC, or the
checkpoint book's value model (``eviction: value``, issue 29), same traces, same run.

Each request of B3's traces (``prefix_trace_workload.py``: the chat trace, the re-sent batch,
the agentic trace) runs through hybridkv's ``KVCacheCoordinator`` with a small device budget
(``--budget`` of B3's default checkpoint budget) and through the ``OffloadingConnector``'s real
scheduler half over a CPU tier of ``--tier-units`` restore units: the device hit, then the
tier's lookup after it, the load's pins (released at once), then the saves of every unit end
the prompt reaches (the engine splits prefill steps there), committed at once (no bytes are
moved: the tier's index, eviction and store planning are the real ones). Token counts do
not depend on the machine's load.

    .venv/bin/python benchmarks/prefix_trace_tiers.py            # granite_small and qwen35
    .venv/bin/python benchmarks/prefix_trace_tiers.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from bench_common import cpu_flags, machine_info
from hybridkv.connectors.base import RequestBlocks
from hybridkv.connectors.offloading.scheduler import OffloadingScheduler
from hybridkv.connectors.offloading.units import UnitGeometry, UnitSave
from hybridkv.connectors.registry import (
    ConnectorContext,
    create_connector,
    parse_kv_transfer_config,
)
from hybridkv.kv.coordinator import KVCacheCoordinator
from hybridkv.kv.hashing import BlockHasher, get_hash_fn
from hybridkv.kv.spec import KVCacheLayout
from kv_core import build_layout
from prefix_trace import (
    BLOCK,
    BUDGET,
    TraceRequest,
    decode,
    granite_small_layout,
    make_coordinator,
)
from prefix_trace_workload import Turn

EVICTIONS = ("lru", "arc", "value")


@dataclass
class TierRequest(TraceRequest):
    @property
    def all_token_ids(self) -> list[int]:
        return self.token_ids


def make_tier(layout: KVCacheLayout, chunk: int, units: int, eviction: str) -> OffloadingScheduler:
    unit_bytes = UnitGeometry(layout, chunk).unit_nbytes(2 * chunk)
    extra = {"cpu_bytes": units * unit_bytes, "chunk_tokens": chunk, "eviction": eviction}
    config = parse_kv_transfer_config(
        {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
         "kv_connector_extra_config": extra}, BLOCK
    )  # fmt: skip
    pair = create_connector(config, ConnectorContext(layout, f"b3-tiers-{eviction}", 1, 1))
    assert isinstance(pair.scheduler, OffloadingScheduler)
    return pair.scheduler


def serve(coord: KVCacheCoordinator, tier: OffloadingScheduler, req: TierRequest) -> int:
    """The prompt as the engine runs it with the tier; returns the tokens it computed."""
    prompt, chunk = req.num_prompt_tokens, tier.config.chunk_tokens
    hit = coord.find_cache_hit(req)
    found = tier.get_num_new_matched_tokens(req, hit.num_tokens)  # type: ignore[arg-type]
    assert found is not None, "every store is committed at once: nothing pending"
    start = hit.num_tokens + found[0]
    assert coord.allocate(req, prompt - start, hit, found[0]), "pool too small"
    req.num_computed_tokens = start
    blocks = RequestBlocks(
        coord.get_block_ids(req.request_id), coord.get_state_slots(req.request_id)
    )
    tier.update_state_after_alloc(req, blocks, found[0])  # type: ignore[arg-type]
    for spec in tier.build_connector_meta([]).loads:  # the load ends: its pins go
        for unit in spec.keys.units:
            tier.stack.unpin(unit.tier, unit.unit_hash, unit.pin)
    ends = [*range((start // chunk + 1) * chunk, prompt, chunk), prompt]
    for begin, end in zip([start, *ends], ends, strict=False):  # steps split at unit ends
        meta = tier.build_connector_meta([(req, begin, end, blocks)])  # type: ignore[list-item]
        for save in meta.saves:
            assert isinstance(save, UnitSave)
            for name in save.tiers:
                tier.stack.get(name).index.commit(save.unit_hash, {})  # type: ignore[union-attr]
    req.num_computed_tokens = prompt
    coord.take_state_copies()
    coord.cache(req, prompt)
    coord.end_step()
    return prompt - start


def run(
    layout_name: str, turns: list[Turn], memory: int, budget: float, chunk: int, units: int,
    eviction: str | None,
) -> dict[str, Any]:  # fmt: skip
    """Computed prompt tokens of the trace (``eviction`` None: no tier)."""
    layout = granite_small_layout() if layout_name == "granite_small" else build_layout(layout_name)
    coord = make_coordinator(layout, "messages", memory, budget)
    tier = make_tier(layout, chunk, max(units, 1), eviction or "lru")
    computed = 0
    for i, turn in enumerate(turns):
        req = TierRequest(f"r{i}", list(turn.prompt), len(turn.prompt), turn.message_ends)
        BlockHasher(BLOCK, get_hash_fn("sha256")).extend(req.block_hashes, req.token_ids)
        if eviction is None:
            hit = coord.find_cache_hit(req)
            assert coord.allocate(req, req.num_prompt_tokens - hit.num_tokens, hit)
            req.num_computed_tokens = req.num_prompt_tokens
            coord.take_state_copies()
            coord.cache(req, req.num_prompt_tokens)
            coord.end_step()
            computed += req.num_prompt_tokens - hit.num_tokens
        else:
            computed += serve(coord, tier, req)
        decode(coord, req, turn.reply)
        coord.check_integrity()
    tier.stack.check_accounting()
    events = tier.take_stats().flatten().events
    stats = {k: v for k, v in events.items() if "skipped" in k or "evict" in k or "hit" in k}
    tier.stack.shutdown()
    return {"computed_tokens": computed, "counters": stats}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import prefix_trace

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layouts", nargs="+", default=["granite_small", "qwen35"])
    p.add_argument("--memory", nargs="+", default=["2GiB", "16GiB"])
    p.add_argument("--budget", type=float, default=0.25, help="times B3's checkpoint budget")
    p.add_argument("--chunk", type=int, default=64, help="chunk_tokens of the units")
    p.add_argument("--tier-units", nargs="+", type=int, default=[16, 64])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    from hybridkv.paths import parse_bytes

    traces = prefix_trace.policy_traces(args.quick)
    rows = []
    for name, mem in zip(args.layouts, args.memory, strict=True):
        memory = parse_bytes(mem, "--memory")
        for trace, turns in traces.items():
            total = sum(len(t.prompt) for t in turns)
            base = run(name, turns, memory, BUDGET * args.budget, args.chunk, 1, None)
            for units in args.tier_units:
                row: dict[str, Any] = {"layout": name, "trace": trace, "tier_units": units,
                                       "prompt_tokens": total, "no_tier": base["computed_tokens"]}  # fmt: skip
                for eviction in EVICTIONS:
                    r = run(name, turns, memory, BUDGET * args.budget, args.chunk, units, eviction)
                    row[eviction] = r["computed_tokens"]
                    row[f"{eviction}_counters"] = r["counters"]
                rows.append(row)
                print(
                    f"{name:14} {trace:8} {units:4d} units: computed no tier {row['no_tier']:7d}"
                    + "".join(f", {e} {row[e]:7d}" for e in EVICTIONS),
                    file=sys.stderr,
                )
    out = {
        "benchmark": "prefix_trace_tiers",
        "machine": machine_info(cpu_flags=cpu_flags(), load_average=os.getloadavg()),
        "workload": {
            "budget_factor": args.budget,
            "chunk_tokens": args.chunk,
            "memory": dict(zip(args.layouts, args.memory, strict=True)),
        },  # fmt: skip
        "rows": rows,
    }
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

"""Descriptors per NIXL load once both engines' block pools have recycled their blocks.

    .venv/bin/python benchmarks/pd_churn.py            # ~1 min
    .venv/bin/python benchmarks/pd_churn.py --quick    # seconds: checks the script runs

A producer and a consumer (tiny Qwen3 with sliding layers, prefix caching on, a cache of a few
hundred blocks) serve prompts of 150-372 tokens through P/D; after the first ``WARM`` requests
every allocation reuses freed blocks. Each load's descriptor count (rows the consumer posts) is
recorded: a descriptor per layer per run of consecutive pages on both sides, plus the K/V split
of a partial block, and the data READ's post (µs; on one host the bytes land inside it). UCX
costs ~3.5 µs per descriptor on one host (B6, scattered tables), so this is what a real,
churned engine pays beyond the bytes. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from bench_common import machine_info  # noqa: E402

WARM = 10  # requests before every allocation reuses freed blocks


def descriptors_after_churn(num_requests: int) -> dict[str, Any]:
    from tests.connectors.nixl.pair import greedy, nixl, run
    from tests.engine.helpers import make_engine, random_ids
    from tests.server.harness import free_port

    from hybridkv.kv.spec import SpecKind
    from hybridkv.model.loading.make_model import make_model

    small = {"kv_cache_memory": 3 << 20, "max_model_len": 1024}
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model("qwen3", Path(tmp) / "m", size="tiny")
        p = make_engine(model, kv_transfer_config=nixl("kv_producer", side_channel_port=free_port()), **small)  # fmt: skip
        d = make_engine(model, kv_transfer_config=nixl("kv_consumer"), **small)
        rows = _record_rows(d)
        info = {
            "blocks_per_engine": p.kv.pool.capacity,
            "attention_layers": sum(
                len(g.layer_ids) for g in d.layout.groups if g.kind is not SpecKind.STATE
            ),  # fmt: skip
        }
        try:
            per_load, post_us = [], []
            for i in range(num_requests):
                prompt = random_ids(150 + 37 * (i % 7), 1000 + i)
                pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
                run(d, prompt, greedy(2, pre.kv_transfer_params), p)
                if i >= WARM and rows:
                    per_load.append(rows[-1][0])
                    post_us.append(rows[-1][1])
                rows.clear()
        finally:
            p.shutdown()
            d.shutdown()
    return {
        **info,
        "loads": len(per_load),
        "read_post_us_median": round(statistics.median(post_us), 1),
        "descriptors_per_load": {
            "median": statistics.median(per_load),
            "mean": round(statistics.mean(per_load), 1),
            "min": min(per_load),
            "max": max(per_load),
        },  # fmt: skip
    }


def _record_rows(engine: Any) -> list[tuple[int, float]]:
    """(rows, µs) of every data READ ``engine``'s NIXL agent posts (same host: the bytes land
    inside the post)."""
    agent = engine.connector.worker.agent
    post, seen = agent.read, []

    def read(remote: str, rows: Any, notif: bytes) -> Any:
        t0 = time.perf_counter()
        out = post(remote, rows, notif)
        seen.append((len(rows), (time.perf_counter() - t0) * 1e6))
        return out

    agent.read = read
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = WARM + 3 if args.quick else args.requests
    print(json.dumps({"machine": machine_info(), "churn": descriptors_after_churn(n)}, indent=2))


if __name__ == "__main__":
    main()

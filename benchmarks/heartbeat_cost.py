"""What lease heartbeats cost per engine step (issue 11's heartbeats), CPU time, no engines.

    .venv/bin/python benchmarks/heartbeat_cost.py            # 1000 waiting requests
    .venv/bin/python benchmarks/heartbeat_cost.py --waiting 100

- ``on_waiting_us``: a consumer step's share: ``KVTransfer``'s filter of the waiting queue and
  the NixlConnector's ``on_waiting`` (every request already parsed once) plus its emission check.
- ``emit_us``: once per ``heartbeat_interval_seconds``: parsing every waiting request's params
  and grouping them per producer (the step a heartbeat is due).
- ``producer_us_per_id``: a producer digesting heartbeats (``Leases.on_notifications``, 256
  ids per message), per request id.
- ``progress_us``: the consumer-only agent's per-step UCX progress (``notifications()``).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, cast

import numpy as np

from hybridkv.connectors.base import KVConnectorRequest
from hybridkv.connectors.nixl.agent import NixlAgent
from hybridkv.connectors.nixl.auth import AuthKey, prompt_digest, sign_params
from hybridkv.connectors.nixl.heartbeats import encode_heartbeats
from hybridkv.connectors.nixl.layout import GroupDesc
from hybridkv.connectors.nixl.leases import Leases
from hybridkv.connectors.nixl.meta import Lease, ParamsPolicy
from hybridkv.connectors.nixl.options import NixlOptions
from hybridkv.connectors.nixl.scheduler import NixlScheduler
from hybridkv.connectors.nixl.stats import NixlStats
from hybridkv.connectors.stats import StatsCounter
from hybridkv.sampling.transfer_params import parse_transfer_params

KEY = AuthKey(b"benchmark-deployment-key", "bench")


class _Req:
    def __init__(self, rid: str) -> None:
        self.request_id = rid
        self.all_token_ids: list[int] = list(range(40))
        params: dict[str, Any] = {
            "do_remote_prefill": True, "remote_engine_id": "p", "remote_host": "127.0.0.1",
            "remote_port": 1, "remote_request_id": rid, "remote_block_ids": [[1, 2]],
            "remote_block_starts": [0], "remote_state": [], "num_tokens": 32,
            "remote_lease": [0, 1], "remote_expires_ms": int(time.time() * 1000) + 600_000,
            "remote_prompt_digest": prompt_digest(self.all_token_ids[:32]),
        }  # fmt: skip
        params["remote_signature"] = sign_params(KEY, parse_transfer_params(params))
        self.transfer_fields = parse_transfer_params(params)  # as SamplingParams does


def cpu_us(fn: Any, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--waiting", type=int, default=1000)
    args = ap.parse_args()
    groups = (GroupDesc("full_attention", 0, 2, 64),)
    policy = ParamsPolicy(KEY, frozenset({"127.0.0.1"}))
    sched = NixlScheduler(NixlOptions(), "d", groups, 16, False, True, policy)
    waiting = [_Req(f"r{i}") for i in range(args.waiting)]

    def consumer_step() -> None:
        found = [r for r in waiting if r.transfer_fields is not None]  # KVTransfer._note_waiting
        sched.on_waiting(cast(list[KVConnectorRequest], found))
        sched.build_connector_meta([])

    def emit() -> None:
        assert sched.waits is not None
        sched.waits.clock = lambda: float("inf")  # due now
        sched.waits._due = 0.0
        assert sched.build_connector_meta([]).saves

    consumer_step()
    ids = [f"r{i}" for i in range(args.waiting)]
    leases = Leases(StatsCounter(NixlStats), np.zeros(len(ids), dtype=np.uint64))
    for i, rid in enumerate(ids):
        leases.start(rid, 120.0, Lease(i, i + 1))
    messages = encode_heartbeats(ids)
    agent = NixlAgent("bench", progress_thread=False)
    result = {
        "waiting": args.waiting,
        "on_waiting_us": round(cpu_us(consumer_step, 200), 1),
        "emit_us": round(cpu_us(emit, 50), 1),
        "producer_us_per_id": round(
            cpu_us(lambda: leases.on_notifications(messages), 200) / len(ids), 3
        ),  # fmt: skip
        "progress_us": round(cpu_us(agent.notifications, 20000), 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""``MultiConnector`` end to end: a slow child with the longest hit (CPU + disk tiers behind
an injected load delay, ``FaultInjection``) and a fast one with a shorter hit (a Valkey remote
tier). ``cost`` learns that the slow child is slow and loads from the fast one; ``first`` and
``weighted`` keep taking the longest hit. Outputs are identical in every run."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.support.stats import counters_with_children
from tests.support.valkey_server import ValkeyProcess, running_valkey

from .helpers import PARAMS, ids, make_llm, reference, reset_device_cache

PREFIX = ids(160, 5)  # slow child: units of 32 -> hits of 160; fast child: 64 -> 128
PROMPTS = [PREFIX + ids(12, 40 + i) for i in range(7)]
DELAY_S = 0.4

pytestmark = pytest.mark.slow


def multi(selection: str, server: ValkeyProcess, disk: Path) -> dict[str, Any]:
    slow = {
        "kv_connector": "FaultInjection",
        "kv_connector_extra_config": {
            "inner": {
                "kv_connector": "OffloadingConnector",
                "kv_connector_extra_config": {
                    "cpu_bytes": "8MiB",
                    "disk_path": str(disk),  # a CPU/disk child: written through to disk
                    "disk_bytes": "64MiB",
                    "chunk_tokens": 32,
                },
            },
            "delay_seconds": DELAY_S,
        },
        "name": "slow",
    }
    fast = {
        "kv_connector": "OffloadingConnector",
        "kv_connector_extra_config": {
            "remote_url": server.url,
            "remote_key_prefix": f"{selection}:",
            "chunk_tokens": 64,
        },
        "name": "fast",
    }
    return {
        "kv_connector": "MultiConnector",
        "kv_connector_extra_config": {"connectors": [slow, fast], "selection": selection},
    }


def run(
    model: Path, selection: str, server: ValkeyProcess, disk: Path
) -> tuple[list[Any], dict[str, float]]:
    llm = make_llm(model, multi(selection, server, disk))
    outs = []
    for prompt in PROMPTS:  # one at a time: each TTFT is its own
        outs.extend(llm.generate([prompt], PARAMS, use_tqdm=False))
        assert llm.engine.connector.worker.wait_for_saves(10.0)  # type: ignore[union-attr]
        reset_device_cache(llm)  # the next prompt's prefix comes from a child
    c = counters_with_children(llm.engine.stats().transfer.connector)
    llm.engine.kv.check_integrity()
    llm.engine.shutdown()
    return outs, c


@pytest.mark.timeout(400)
def test_cost_selection_beats_first_and_weighted_on_ttft(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    model = checkpoints["qwen3"]
    want = reference(model, PROMPTS)
    ttft: dict[str, float] = {}
    with running_valkey(tmp_path / "valkey") as server:
        for selection in ("first", "weighted", "cost"):
            outs, c = run(model, selection, server, tmp_path / f"disk-{selection}")
            assert [o.token_ids for o in outs] == want, selection
            ttft[selection] = statistics.median(o.metrics["ttft_s"] for o in outs[1:])
            if selection == "cost":  # the slow child is tried once, measured, then avoided
                # (for the fast child's hit, or recompute when the machine makes that cheaper)
                assert c.get("selected.slow", 0) <= 2, c
                assert outs[-1].cached_tokens.get("cpu", 0) == 0
            else:  # the longest hit, every time
                assert c["selected.slow"] == len(PROMPTS) - 1, c
                assert outs[-1].cached_tokens.get("cpu", 0) == 160
    assert ttft["cost"] < ttft["first"] - DELAY_S / 2, ttft
    assert ttft["cost"] < ttft["weighted"] - DELAY_S / 2, ttft

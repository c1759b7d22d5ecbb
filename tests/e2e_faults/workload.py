"""The fault acceptance workload: prompts, connector configs, a load recorder, and the failures
``FaultInjection`` is expected to inject, computed independently of the engine.

Phase 1 (warm-up) stores the prompts' KV with a plain ``FileConnector``; phase 2 runs the same
prompts on a fresh engine (empty device cache) through ``FaultInjection`` over a
``FileConnector`` on the same directory, so every prompt is an external hit loaded from files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridkv import LLM, SamplingParams
from hybridkv.connectors.fault.connector import FaultInjectionWorker
from hybridkv.connectors.fault.plan import TIMEOUT, plan_faults
from hybridkv.engine.output import RequestOutput
from hybridkv.step_io import ConnectorMetadata, LoadSpec
from tests.support.lifetimes import track
from tests.support.prompts import random_ids

OPTIONS: dict[str, Any] = {"dtype": "float32", "block_size": 16, "kv_cache_memory": "32MiB"}
MAX_TOKENS = 8


def greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def make_prompts() -> list[list[int]]:
    """Seven prompts of 40-150 tokens; most share a prefix with another (mid-block too)."""
    base = random_ids(150, 11)
    other = random_ids(90, 12)
    return [
        base[:40],  # the shared prefix, ends mid-block
        base[:64] + random_ids(20, 13),  # a 64-token shared prefix
        base[:100] + random_ids(9, 14),  # a prefix that ends mid-block
        list(base),  # the longest: 150 tokens
        other,  # an unrelated prompt
        other[:70] + random_ids(30, 15),  # shares a mid-block prefix with it
        base[:48],  # exactly three blocks
    ]


def file_config(path: Path, load_mode: str = "sync", **top: Any) -> dict[str, Any]:
    extra = {"path": str(path), "load_mode": load_mode}
    return {"kv_connector": "FileConnector", "kv_connector_extra_config": extra, **top}


def fault_config(
    path: Path, load_mode: str, policy: str = "recompute", **faults: Any
) -> dict[str, Any]:
    return {
        "kv_connector": "FaultInjection",
        "kv_load_failure_policy": policy,
        "kv_connector_extra_config": {"inner": file_config(path, load_mode), **faults},
    }


def make_llm(model: Path, kv_transfer_config: dict[str, Any] | None = None) -> LLM:
    return track(LLM(str(model), kv_transfer_config=kv_transfer_config, **OPTIONS))


def generate(llm: LLM, prompts: list[list[int]]) -> list[RequestOutput]:
    return llm.generate(prompts, greedy(), use_tqdm=False)


def assert_no_leaks(llm: LLM) -> None:
    engine = llm.engine
    assert not engine.has_unfinished_requests()
    engine.kv.check_integrity()
    assert engine.kv.is_idle(), "blocks or state slots still held after every request finished"


class LoadRecorder:
    """Records every ``LoadSpec`` the worker half is asked to start (wraps ``start_load``)."""

    def __init__(self, llm: LLM) -> None:
        connector = llm.engine.connector
        assert connector is not None
        self.worker = connector.worker
        self.specs: list[LoadSpec] = []
        inner_start = self.worker.start_load

        def start_load(metadata: ConnectorMetadata) -> None:
            self.specs.extend(metadata.loads)
            inner_start(metadata)

        self.worker.start_load = start_load  # type: ignore[method-assign]

    def by_request(self) -> dict[str, LoadSpec]:
        out: dict[str, LoadSpec] = {}
        for spec in self.specs:
            assert spec.request_id not in out, f"{spec.request_id} loaded externally twice"
            out[spec.request_id] = spec
        return out


@dataclass
class Expected:
    """What ``FaultInjection`` breaks, per request (from its own decision function)."""

    affected: dict[str, set[str]] = field(default_factory=dict)  # request id -> reasons
    load_failures: Counter[str] = field(default_factory=Counter)  # the scheduler's count
    injected: Counter[str] = field(default_factory=Counter)  # the connector's count
    recomputed_tokens: int = 0  # hybrids restart: every token computed so far is redone


def expected_faults(recorder: LoadRecorder) -> Expected:
    worker = recorder.worker
    assert isinstance(worker, FaultInjectionWorker)
    config, states = worker.config, worker.layout.state_group_ids
    exp = Expected()
    for rid, spec in recorder.by_request().items():
        if spec.is_async and config.delay_seconds > config.load_timeout_seconds:
            reasons, scheduler_reasons = [TIMEOUT], [TIMEOUT]
        else:
            plan = plan_faults(config, spec, states)
            if plan.request_reason is not None:
                reasons = scheduler_reasons = [plan.request_reason]
            else:
                state_reasons = list(plan.states.values())
                reasons = list(plan.blocks.values()) + state_reasons
                # the scheduler counts a request's state failure once (invalid_state)
                scheduler_reasons = list(plan.blocks.values()) + state_reasons[:1]
        if reasons:
            exp.affected[rid] = set(reasons)
            exp.recomputed_tokens += spec.end
        exp.injected.update(reasons)
        exp.load_failures.update(scheduler_reasons)
    return exp

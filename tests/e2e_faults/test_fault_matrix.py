"""Issue 4 acceptance: real tiny models, FileConnector under FaultInjection, never a wrong token.

For each architecture (Qwen3 with sliding layers, Gemma 3, Granite 4.0-H) a warm-up engine
stores the prompts' KV in files; then a fresh engine (empty device cache) runs the same prompts
through ``FaultInjection`` over a ``FileConnector`` on that directory, sync and async, with each
failure policy and fault mix. The requests a fault touches are computed from the load specs the
worker received and ``FaultInjection``'s own decision function (``plan_faults``), not from the
engine's bookkeeping, and checked against what the engine did:

- ``recompute``: every greedy output equals the output with no connector at all;
- ``fail``: exactly the affected requests finish with reason ``error`` and a message, the
  others equal the reference;
- the scheduler's failure counts, recomputed tokens and failed requests, and the connector's
  injected-failure counters, match the faults injected; nothing leaks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hybridkv.engine.output import RequestOutput
from tests.support.stats import flat_counters

from .conftest import Builder
from .workload import (
    LoadRecorder,
    assert_no_leaks,
    expected_faults,
    fault_config,
    file_config,
    generate,
    make_llm,
    make_prompts,
)

ARCHS = ("qwen3", "gemma3", "granitemoehybrid")

# name -> FaultInjection options. Seeds are fixed so every faulty case injects at least one
# failure into the seven loads (asserted below; request ids are req-0..req-6).
FAULTS: dict[str, dict[str, Any]] = {
    "none": {"block_failure_rate": 0.0},
    "block5": {"block_failure_rate": 0.05, "seed": 0},
    "block30": {"block_failure_rate": 0.3, "seed": 0},
    "request10": {"request_failure_rate": 0.1, "seed": 3},
    "corrupt10": {"corrupt_rate": 0.1, "seed": 1},
    "timeout": {"delay_seconds": 0.2, "load_timeout_seconds": 0.05},  # async loads only
}


@dataclass(frozen=True)
class Warm:
    arch: str
    model: Path
    store: Path
    prompts: list[list[int]]
    reference: list[list[int]]  # greedy ids with no connector at all


@pytest.fixture(scope="module", params=ARCHS)
def warm(
    request: pytest.FixtureRequest, checkpoint: Builder, tmp_path_factory: pytest.TempPathFactory
) -> Warm:
    """Phase 1: the reference (no connector) and a warm-up run that stores every prompt's KV."""
    arch = request.param
    model = checkpoint(arch)
    store = tmp_path_factory.mktemp(f"kv_{arch}")
    prompts = make_prompts()
    plain = make_llm(model)
    reference = [o.token_ids for o in generate(plain, prompts)]
    writer = make_llm(model, file_config(store))
    first = generate(writer, prompts)
    writer.engine.shutdown()  # waits until every save is on disk
    assert [o.token_ids for o in first] == reference, "the warm-up run must not change outputs"
    assert all(o.cached_tokens.get("disk", 0) == 0 for o in first), "nothing stored yet"
    assert flat_counters(writer.engine.stats().transfer.connector).get("store_blocks", 0) > 0
    assert_no_leaks(writer)
    return Warm(arch, model, store, prompts, reference)


def run_phase2(warm: Warm, config: dict[str, Any]) -> tuple[Any, list[RequestOutput], LoadRecorder]:
    llm = make_llm(warm.model, config)
    recorder = LoadRecorder(llm)
    outs = generate(llm, warm.prompts)
    llm.engine.shutdown()
    return llm, outs, recorder


CASES = [
    (mode, policy, fault)
    for mode in ("sync", "async")
    for policy in ("recompute", "fail")
    for fault in FAULTS
    if not (fault == "timeout" and mode == "sync")  # a sync load cannot time out
]


@pytest.mark.parametrize(("mode", "policy", "fault"), CASES, ids=["-".join(c) for c in CASES])
def test_faults_never_give_a_wrong_token(warm: Warm, mode: str, policy: str, fault: str) -> None:
    llm, outs, recorder = run_phase2(warm, fault_config(warm.store, mode, policy, **FAULTS[fault]))
    specs = recorder.by_request()
    exp = expected_faults(recorder)
    assert len(specs) == len(warm.prompts), "every prompt is an external hit on a cold engine"
    if fault != "none":
        assert exp.affected, f"{fault}: the fixed seed must inject at least one failure"

    stats = llm.engine.scheduler.transfer.stats
    counters = flat_counters(llm.engine.stats().transfer.connector)
    what = f"{warm.arch} {mode} {policy} {fault}"
    for i, out in enumerate(outs):
        rid = out.request_id
        where = f"{what}: prompt {i} ({rid}, {len(warm.prompts[i])} tokens)"
        spec = specs[rid]
        if rid in exp.affected and policy == "fail":
            assert out.finish_reason == "error", f"{where} was affected: {exp.affected[rid]}"
            assert out.error and "kv_load_failure_policy is 'fail'" in out.error, where
            assert any(f"({reason})" in out.error for reason in exp.affected[rid]), out.error
            continue
        assert out.finish_reason == "length" and out.error is None, f"{where}: {out.error}"
        assert out.token_ids == warm.reference[i], f"{where}: wrong tokens"
        if rid in exp.affected:  # recomputed: the disk tokens were not served after all
            assert "disk" not in out.cached_tokens, where
        else:
            assert out.cached_tokens.get("disk") == spec.end - spec.start > 0, where

    errored = {o.request_id for o in outs if o.finish_reason == "error"}
    assert errored == (set(exp.affected) if policy == "fail" else set()), what
    assert stats.failed_requests == len(exp.affected), what
    assert Counter(stats.load_failures) == exp.load_failures, what
    assert stats.recomputed_tokens == (exp.recomputed_tokens if policy == "recompute" else 0)
    assert stats.external_tokens == sum(s.end - s.start for s in specs.values())
    injected = Counter(
        {k.split(":", 1)[1]: int(v) for k, v in counters.items() if k.startswith("injected_fail")}
    )
    assert injected == exp.injected, what
    # FaultInjection breaks bytes in memory only: the files themselves all verified
    assert not [k for k in counters if k.startswith("load_failures:")], counters
    assert counters.get("files_removed", 0) == 0
    assert_no_leaks(llm)


def test_same_engine_after_a_prefix_cache_reset_loads_from_disk(warm: Warm) -> None:
    """The other way to get a cold device cache: reset the prefix cache of an idle engine."""
    llm = make_llm(warm.model, file_config(warm.store, "async", kv_role="kv_consumer"))
    first = generate(llm, warm.prompts)  # loads from disk: nothing is cached on the device yet
    assert all(o.cached_tokens.get("disk", 0) > 0 for o in first)
    again = generate(llm, warm.prompts)  # served from the device prefix cache first
    assert sum(o.cached_tokens["local"] for o in again) > 0
    for a, b in zip(first, again, strict=True):
        assert b.num_cached_tokens == a.num_cached_tokens  # disk only tops up a short local hit
    assert llm.engine.kv.reset_prefix_cache(), "an idle engine can drop its prefix cache"
    third = generate(llm, warm.prompts)
    assert all(o.cached_tokens.get("disk", 0) > 0 for o in third)
    for outs in (first, again, third):
        assert [o.token_ids for o in outs] == warm.reference
    llm.engine.shutdown()
    assert_no_leaks(llm)

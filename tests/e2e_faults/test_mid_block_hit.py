"""External hits that end mid-block, through the engine with a real model and the FileConnector.

The FileConnector stores and offers whole blocks only, so its hit always ends on a block
boundary; a hit still ends mid-block whenever it covers the whole prompt: the scheduler rewinds
an external hit to N-1 (the last prompt token is computed for its logits). With a prompt of
exactly 4 blocks the external range is [0, 63) and the engine must compute exactly token 63.
A spy on the model runner records what each step computes, token by token.

Also here: a full-attention-only model resumes a failed load in place at its first bad block
(any prefix is a valid resume point there), recomputing exactly the tokens from that block on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybridkv import LLM
from hybridkv.connectors.fault.plan import FaultConfig, plan_faults
from hybridkv.connectors.registry import parse_kv_transfer_config
from hybridkv.step_io import LoadSpec, SchedulerOutput
from tests.support.stats import flat_counters

from .conftest import Builder
from .workload import (
    LoadRecorder,
    assert_no_leaks,
    fault_config,
    file_config,
    generate,
    make_llm,
    random_ids,
)

B = 16
FULL_ONLY = {"use_sliding_window": False, "layer_types": ["full_attention"] * 4}


class RunnerSpy:
    """Records ``(request id, first position, token ids)`` of every slice each step computes."""

    def __init__(self, llm: LLM) -> None:
        self.steps: list[list[tuple[str, int, list[int]]]] = []
        runner = llm.engine.runner
        execute = runner.execute

        def spy(out: SchedulerOutput) -> Any:
            self.steps.append(
                [(r.request_id, r.start_pos, list(r.token_ids)) for r in out.requests]
            )
            return execute(out)

        runner.execute = spy  # type: ignore[method-assign]

    def slices(self, request_id: str) -> list[tuple[int, list[int]]]:
        return [
            (start, ids) for step in self.steps for rid, start, ids in step if rid == request_id
        ]


@pytest.fixture(scope="module")
def full_model(checkpoint: Builder) -> Path:
    return checkpoint("qwen3", name="qwen3_full_attention", **FULL_ONLY)


@pytest.fixture(scope="module")
def stored(full_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A 64-token prompt (4 whole blocks) whose KV is in files; its reference output."""
    prompt = random_ids(4 * B, 21)
    store = tmp_path_factory.mktemp("kv_full")
    writer = make_llm(full_model, file_config(store))
    assert writer.engine.kv.is_full_attention_only
    generate(writer, [prompt])
    writer.engine.shutdown()
    assert flat_counters(writer.engine.stats().transfer.connector)["store_blocks"] == 4
    return store, prompt


@pytest.fixture(scope="module")
def reference(full_model: Path, stored: tuple[Path, list[int]]) -> list[int]:
    return generate(make_llm(full_model), [stored[1]])[0].token_ids


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_external_hit_ending_mid_block_computes_exactly_the_rest(
    full_model: Path, stored: tuple[Path, list[int]], reference: list[int], mode: str
) -> None:
    store, prompt = stored
    llm = make_llm(full_model, file_config(store, mode))
    spy = RunnerSpy(llm)
    (out,) = generate(llm, [prompt])
    llm.engine.shutdown()
    rid = out.request_id
    slices = spy.slices(rid)
    # the hit ends at 63 = 3 * 16 + 15, inside block 3, one token before the prompt's end
    assert out.cached_tokens == {"local": 0, "disk": 4 * B - 1}
    assert slices[0] == (4 * B - 1, prompt[4 * B - 1 :])
    # then one decode token per step, each at the next position
    assert [start for start, _ in slices] == list(range(4 * B - 1, 4 * B - 1 + len(slices)))
    assert all(len(ids) == 1 for _, ids in slices)
    assert out.token_ids == reference
    assert llm.engine.scheduler.transfer.stats.external_tokens == 4 * B - 1
    assert_no_leaks(llm)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_local_hit_topped_up_mid_block_from_disk(
    full_model: Path, stored: tuple[Path, list[int]], reference: list[int], mode: str
) -> None:
    """A repeat of a cached prompt: the local hit stops a block short of the end, the file
    tier tops it up to N-1 (mid-block), and only the last token is computed."""
    store, prompt = stored
    llm = make_llm(full_model, file_config(store, mode, kv_role="kv_consumer"))
    (first,) = generate(llm, [prompt])
    spy = RunnerSpy(llm)
    (again,) = generate(llm, [prompt])
    llm.engine.shutdown()
    local = again.cached_tokens["local"]
    assert local % B == 0 and 0 < local < 4 * B
    assert again.cached_tokens == {"local": local, "disk": 4 * B - 1 - local}
    assert spy.slices(again.request_id)[0] == (4 * B - 1, prompt[4 * B - 1 :])
    assert first.token_ids == again.token_ids == reference
    assert_no_leaks(llm)


def _seed_failing_first_at(block: int, rate: float) -> int:
    """A FaultInjection seed whose first failed block of req-0's 4-block load is ``block``."""
    spec = LoadSpec("req-0", 0, 4 * B - 1, ([1, 2, 3, 4],), ([0, 1, 2, 3],), (), False, None)
    for seed in range(10_000):
        inner = parse_kv_transfer_config(
            {"kv_connector": "FileConnector", "kv_connector_extra_config": {"path": "/unused"}}, B
        )
        config = FaultConfig(inner, block_failure_rate=rate, seed=seed)
        bad = plan_faults(config, spec, ()).blocks
        if bad and min(bad) == block + 1:  # block ids are 1..4 for indices 0..3
            return seed
    raise AssertionError("no such seed")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_full_attention_only_resumes_at_the_first_bad_block(
    full_model: Path, stored: tuple[Path, list[int]], reference: list[int], mode: str
) -> None:
    store, prompt = stored
    seed = _seed_failing_first_at(2, rate=0.3)
    llm = make_llm(full_model, fault_config(store, mode, block_failure_rate=0.3, seed=seed))
    recorder = LoadRecorder(llm)
    spy = RunnerSpy(llm)
    (out,) = generate(llm, [prompt])
    llm.engine.shutdown()
    (spec,) = recorder.specs
    assert spec.request_id == out.request_id == "req-0"
    config = recorder.worker.config  # type: ignore[attr-defined]
    bad_indices = sorted(
        k
        for ids, indices in zip(spec.block_ids, spec.block_indices, strict=True)
        for block_id, k in zip(ids, indices, strict=True)
        if block_id in plan_faults(config, spec, ()).blocks
    )
    assert bad_indices[0] == 2
    slices = spy.slices(out.request_id)
    if mode == "sync":  # the step that used the bad bytes ran; its output was discarded
        assert slices[0] == (4 * B - 1, prompt[4 * B - 1 :])
        slices = slices[1:]
    # resumed in place at block 2: tokens 32..63 are recomputed, blocks 0 and 1 kept
    assert slices[0] == (2 * B, prompt[2 * B :])
    stats = llm.engine.scheduler.transfer.stats
    assert stats.recomputed_tokens == (4 * B - 1) - 2 * B
    assert stats.failed_requests == 1
    assert stats.load_failures == {"injected": len(bad_indices)}
    assert "disk" not in out.cached_tokens
    assert out.token_ids == reference
    assert_no_leaks(llm)

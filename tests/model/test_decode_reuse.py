"""Decode input reuse (``model/step/decode_reuse.py``): every step's inputs, reused or built,
equal a fresh ``build_step`` of the same step: over many decode steps across block edges and
a sliding window, with requests joining and leaving, and through the engine with prefix hits
and preemption. Reuse does happen in the steady steps (the test is not vacuous)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridkv.model.layers.step_context import KernelAttnMeta, StepContext
from hybridkv.model.step.decode_reuse import DecodeInputs
from hybridkv.model.step.step_builder import StepInputs, build_step
from tests.engine.helpers import greedy, make_engine, make_prompt_set, run_staggered
from tests.engine.test_preemption import one_request_budget
from tests.model.conftest import make_runner
from tests.model.test_decode_program import gguf_sized  # noqa: F401 (fixture)
from tests.support.driver import RunnerDriver


class CheckedInputs(DecodeInputs):
    """Each step's inputs checked against a fresh build of the same step."""

    def build(self, *args: object, **kw: object) -> StepInputs:
        ours = super().build(*args, **kw)  # type: ignore[arg-type]
        assert_same_inputs(ours, build_step(*args, **kw))  # type: ignore[arg-type]
        return ours


def assert_same_inputs(ours: StepInputs, fresh: StepInputs) -> None:
    assert torch.equal(ours.input_ids, fresh.input_ids)
    assert torch.equal(ours.sample_token_idx, fresh.sample_token_idx)
    _assert_same_ctx(ours.ctx, fresh.ctx)


def _assert_same_ctx(ours: StepContext, fresh: StepContext) -> None:
    assert torch.equal(ours.positions, fresh.positions)
    assert ours.max_position == fresh.max_position
    assert ours.attn_meta.keys() == fresh.attn_meta.keys()
    for layer, meta in ours.attn_meta.items():
        other = fresh.attn_meta[layer]
        assert isinstance(meta, KernelAttnMeta) and isinstance(other, KernelAttnMeta)
        a, b = meta.table, other.table
        assert a.window == b.window
        for x, y in ((a.block_table, b.block_table), (a.rows, b.rows), (a.positions, b.positions)):
            assert torch.equal(x, y), layer
    assert ours.state_meta.keys() == fresh.state_meta.keys()
    for layer, state in ours.state_meta.items():
        other_state = fresh.state_meta[layer]
        assert state.decode_slot_run == other_state.decode_slot_run
        assert (state.taps is None) == (other_state.taps is None)
        for name in ("decode_token_idx", "decode_slots", "prefill_gather", "prefill_valid",
                     "prefill_lens", "prefill_slots", "prefill_token_idx"):  # fmt: skip
            assert torch.equal(getattr(state, name), getattr(other_state, name)), name


@pytest.mark.parametrize("arch", ["gemma3", "granitemoehybrid"])
def test_reused_inputs_equal_a_fresh_build(
    arch: str,
    gguf_sized: dict[str, Path],  # noqa: F811
) -> None:
    """Across block edges (16-token blocks) and gemma3's 32-token sliding window, with a
    request joining (a prefill step) and one leaving."""
    runner = make_runner(gguf_sized[arch])
    runner.step_inputs = checked = CheckedInputs()
    driver = RunnerDriver(runner)
    driver.add("a", list(range(3, 14)))
    driver.add("b", list(range(40, 45)))
    driver.step({"a": 11, "b": 5})
    driver.decode_all(["a", "b"], 30)  # a crosses positions 16, 32 and the window
    driver.add("c", [5, 9, 2])
    driver.step({"a": 1, "b": 1, "c": 3})  # c joins
    driver.decode_all(["a", "b", "c"], 5)
    driver.decode_all(["c", "b"], 5)  # a left; the others in a new order
    assert checked.reused >= 30
    assert checked.built >= 6
    outputs = {rid: r.output for rid, r in driver.requests.items()}
    driver_off = RunnerDriver(make_runner(gguf_sized[arch]))
    driver_off.runner.step_inputs = no_reuse = _NoReuse()
    for rid in ("a", "b", "c"):
        driver_off.add(rid, driver.requests[rid].prompt)
    driver_off.step({"a": 11, "b": 5})
    driver_off.decode_all(["a", "b"], 30)
    driver_off.step({"a": 1, "b": 1, "c": 3})
    driver_off.decode_all(["a", "b", "c"], 5)
    driver_off.decode_all(["c", "b"], 5)
    assert no_reuse.reused == 0
    assert {rid: r.output for rid, r in driver_off.requests.items()} == outputs


class _NoReuse(DecodeInputs):
    def build(self, *args: object, **kw: object) -> StepInputs:
        self.built += 1
        return build_step(*args, **kw)  # type: ignore[arg-type]


def test_prefix_hits_and_preemption_keep_fresh_inputs(
    gguf_sized: dict[str, Path],  # noqa: F811
) -> None:
    free = make_engine(gguf_sized["granitemoehybrid"], max_model_len=136)
    budget = one_request_budget(free)
    engine = make_engine(
        gguf_sized["granitemoehybrid"], max_model_len=136, enable_prefix_caching=True,
        kv_cache_memory=budget,
    )  # fmt: skip
    engine.runner.step_inputs = checked = CheckedInputs()
    params = [greedy(32, ignore_eos=True)] * 10
    outs = run_staggered(engine, make_prompt_set(), params, steps_between=1)
    assert engine.scheduler.num_preemptions > 0
    assert any(out.num_cached_tokens > 0 for out in outs)
    assert checked.reused > 50 and checked.built > 10

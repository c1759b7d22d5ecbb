"""Preemption: with room for one max_model_len request only, every request still completes
with the outputs of an unconstrained run, and nothing leaks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridkv import SamplingParams
from hybridkv.engine.core import EngineCore
from tests.engine.helpers import (
    TOL,
    assert_no_leaks,
    greedy,
    make_engine,
    random_ids,
    run_staggered,
)
from tests.support.checkpoints import HF_ARCHS

MAX_MODEL_LEN = 64
PROMPT_LENS = (17, 20, 24, 18)


def one_request_budget(engine: EngineCore) -> int:
    """The smallest ``kv_cache_memory`` that holds one request of ``max_model_len`` tokens:
    every state slot but the checkpoint room (which only spare memory gets), plus a full table
    per attention group, plus the null block."""
    layout = engine.layout
    blocks = -(-engine.max_model_len // layout.block_size) * len(layout.attention_group_ids) + 1
    live = engine.sizing.num_state_slots - engine.sizing.checkpoint_room
    slots = live * layout.total_state_slot_bytes()
    return slots + blocks * layout.page_bytes


def mixed_params() -> list[SamplingParams]:
    """Greedy and seeded sampling: a seeded request must survive preemption unchanged too."""
    return [
        greedy(30, ignore_eos=True)
        if i % 2 == 0
        else SamplingParams(temperature=1.0, seed=i, max_tokens=30, ignore_eos=True)
        for i in range(len(PROMPT_LENS))
    ]


@pytest.mark.parametrize(
    ("arch", "caching"), [(arch, True) for arch in HF_ARCHS] + [("granitemoehybrid", False)]
)
def test_preempted_requests_finish_with_unconstrained_outputs(
    arch: str, caching: bool, checkpoints: dict[str, Path]
) -> None:
    model_dir = checkpoints[arch]
    prompts = [random_ids(n, 20 + i) for i, n in enumerate(PROMPT_LENS)]
    opts = {"max_model_len": MAX_MODEL_LEN, "enable_prefix_caching": caching}
    free = make_engine(model_dir, **opts)
    expected = run_staggered(free, prompts, mixed_params(), steps_between=0)
    assert free.scheduler.num_preemptions == 0

    tight = make_engine(model_dir, kv_cache_memory=one_request_budget(free), **opts)
    outs = run_staggered(tight, prompts, mixed_params(), steps_between=0)

    assert tight.scheduler.num_preemptions > 0
    for i, (out, ref) in enumerate(zip(outs, expected, strict=True)):
        assert out.finish_reason == ref.finish_reason == "length"
        assert out.token_ids == ref.token_ids, f"request {i}"
        diff = (torch.tensor(out.logits) - torch.tensor(ref.logits)).abs().max().item()
        assert diff < TOL, f"request {i}: logits moved by {diff:.2e}"
    assert_no_leaks(tight)
    assert_no_leaks(free)


def test_a_budget_below_one_request_is_a_clear_error(checkpoints: dict[str, Path]) -> None:
    model_dir = checkpoints["granitemoehybrid"]
    budget = one_request_budget(make_engine(model_dir, max_model_len=MAX_MODEL_LEN))
    with pytest.raises(ValueError, match="kv_cache_memory.*max_model_len=64"):
        make_engine(model_dir, max_model_len=MAX_MODEL_LEN, kv_cache_memory=budget - 1)

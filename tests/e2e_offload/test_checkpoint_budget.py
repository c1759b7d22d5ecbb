"""Issue 13: with the offloading connector, state checkpoints evicted from the bounded device
pool stay loadable from the tiers (units carry the state at their end), so a later request
still resumes deep into the shared prefix, with the output of a run that caches nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import PROMPTS, assert_clean, counters, generate, make_llm, offload, reference


@pytest.mark.timeout(300)
@pytest.mark.parametrize("budget", [None, 1e-9])  # evicted by hand; a budget of no checkpoint
def test_evicted_checkpoints_load_from_the_cpu_tier(
    budget: float | None, checkpoints: dict[str, Path]
) -> None:
    model = checkpoints["granitemoehybrid"]
    extra = {} if budget is None else {"state_checkpoint_budget": budget}
    llm = make_llm(model, offload(cpu="8MiB"), **extra)
    (sm,) = llm.engine.kv.state
    first = generate(llm, PROMPTS[:1])
    if budget is None:
        assert sm.book.count() > 0
        while sm.book.evict_one():
            pass
    assert sm.book.count() == 0  # no local checkpoint left: the state must come from a tier
    second = generate(llm, PROMPTS[1:2])
    assert [o.token_ids for o in first + second] == reference(model, PROMPTS[:2])
    assert second[0].cached_tokens.get("local", 0) == 0
    assert second[0].num_cached_tokens >= 128  # the 4 shared units, state included
    assert counters(llm)["hits.cpu"] > 0
    assert_clean(llm)

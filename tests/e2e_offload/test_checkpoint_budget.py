"""Issue 13: with the offloading connector, state checkpoints evicted from the bounded device
pool stay loadable from the tiers (units carry the state at their end), so a later request
still resumes deep into the shared prefix, with the output of a run that caches nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import (
    PROMPTS,
    assert_clean,
    counters,
    generate,
    ids,
    make_llm,
    offload,
    reference,
    reset_device_cache,
    unit_bytes,
)


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


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("eviction", "kept"), [("lru", False), ("value", True)])
def test_the_tier_keeps_a_reused_head_through_a_flood_by_the_books_value(
    eviction: str, kept: bool, checkpoints: dict[str, Path]
) -> None:
    """Issue 29: a CPU tier of 6 units, a 4-unit head reused once, then 4 one-shot prompts
    (12 units): by the book's value the head stays (the flood's low-value units are
    skipped), by LRU it is gone; outputs equal a run that caches nothing either way."""
    model = checkpoints["granitemoehybrid"]
    llm = make_llm(model, offload(cpu=6 * unit_bytes(model), eviction=eviction))
    flood = [ids(100, 500 + i) for i in range(4)]
    outs = []
    for prompts in ([PROMPTS[0]], [PROMPTS[1]], *([p] for p in flood), [PROMPTS[2]]):
        reset_device_cache(llm)  # every hit comes from the tier
        outs += generate(llm, prompts)
    assert [o.token_ids for o in outs] == reference(model, [*PROMPTS[:2], *flood, PROMPTS[2]])
    assert (outs[-1].cached_tokens.get("cpu", 0) >= 128) is kept
    assert ("stores_skipped_low_value.cpu" in counters(llm)) is kept
    assert_clean(llm)

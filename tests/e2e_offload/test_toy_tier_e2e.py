"""The test-only toy tier (``tests/connectors/offloading/test_toy_tier.py``: a dict of unit
bytes, registered from the test, nothing under ``src/``) behind a real engine: a prefix comes
back from it after the device prefix cache is reset, greedy outputs equal a run that caches
nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridkv.connectors.offloading.tier_registry import register_tier, unregister_tier
from tests.connectors.offloading.test_toy_tier import TOY, TOY_ENTRY, ToyTier

from .helpers import (
    PROMPTS,
    assert_clean,
    counters,
    generate,
    make_llm,
    offload,
    reference,
    reset_device_cache,
    sched,
)


@pytest.fixture
def toy_registered() -> Iterator[None]:
    register_tier(TOY_ENTRY)
    try:
        yield
    finally:
        unregister_tier(TOY)


@pytest.mark.usefixtures("toy_registered")
def test_a_registered_tier_serves_a_prefix_after_a_device_reset(
    checkpoints: dict[str, Path],
) -> None:
    model = checkpoints["qwen3"]
    prompts = PROMPTS[:2]
    want = reference(model, prompts)
    llm = make_llm(model, offload(toy_units=16))
    tier = sched(llm).stack.fastest
    assert isinstance(tier, ToyTier)
    first = generate(llm, prompts[:1])
    assert tier.units, "the toy tier stored nothing"
    reset_device_cache(llm)  # only the toy tier remembers the prefix
    second = generate(llm, prompts[1:])
    assert second[0].cached_tokens == {"local": 0, TOY: 128}
    assert [o.token_ids for o in first + second] == want
    c = counters(llm)
    assert c["hits.toy"] == 4 and c["stores.toy"] >= 4
    assert not any(name.startswith("load_failures") for name in c)
    assert_clean(llm)
    llm.engine.shutdown()

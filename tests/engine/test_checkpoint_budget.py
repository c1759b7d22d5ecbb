"""``state_checkpoint_budget`` -> checkpoints per state group, and its validation."""

from __future__ import annotations

import pytest

from hybridkv.config import CacheConfig, EngineConfig
from hybridkv.engine.sizing import checkpoint_capacity
from tests.kv.builders import make_layout


def test_capacity_is_the_budget_in_whole_boundary_checkpoints() -> None:
    layout = make_layout("granite")  # one state group of 6 mamba layers
    per_boundary = layout.total_state_slot_bytes()
    assert checkpoint_capacity(0.1, 100 * per_boundary, layout) == 10
    assert checkpoint_capacity(0.1, 100 * per_boundary - 1, layout) == 9  # never over
    assert checkpoint_capacity(1e-9, 100 * per_boundary, layout) == 0
    assert checkpoint_capacity(0.5, 10**9, make_layout("full")) is None  # no state groups


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.01, float("nan"), float("inf"), True, "0.1"])
def test_bad_budget_is_named(bad: object) -> None:
    with pytest.raises(ValueError, match="state_checkpoint_budget=.*must be a fraction"):
        CacheConfig(state_checkpoint_budget=bad)  # type: ignore[arg-type]


def test_budget_option_reaches_the_cache_config() -> None:
    config = EngineConfig.create("m", state_checkpoint_budget=0.25)
    assert config.cache.state_checkpoint_budget == 0.25
    assert CacheConfig().state_checkpoint_budget == 0.1

"""``state_checkpoint_budget`` -> checkpoints per state group, and its validation."""

from __future__ import annotations

import pytest

from hybridkv.config import CacheConfig, EngineConfig
from hybridkv.engine.sizing import CacheSizing, checkpoint_capacity, size_cache
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


def _sizing(
    layout_name: str, memory: int, max_model_len: int = 64, **options: object
) -> CacheSizing:
    config = EngineConfig.create("m", kv_cache_memory=memory, max_num_seqs=4, **options)
    return size_cache(config, make_layout(layout_name), max_model_len)


def test_the_default_pool_has_room_for_the_budget() -> None:
    """Live, trailing and pending states of every running request (3 x 4 + 16 = 28 slots) plus
    the budget's checkpoints: without that room the pool held ~2 checkpoints per running
    request whatever the budget."""
    layout = make_layout("granite")
    memory = 4000 * layout.total_state_slot_bytes()
    s = _sizing("granite", memory)
    cap = checkpoint_capacity(0.1, memory, layout)
    assert cap == 400 and s.max_checkpoints == cap
    assert (s.num_state_slots, s.checkpoint_room) == (28 + cap, cap)
    assert s.num_blocks == layout.num_blocks_for(memory, 28 + cap)
    off = _sizing("granite", memory, enable_prefix_caching=False)
    assert (off.num_state_slots, off.checkpoint_room) == (28, 0)  # nothing to keep
    fixed = _sizing("granite", memory, num_state_slots=50)
    assert (fixed.num_state_slots, fixed.checkpoint_room) == (50, 0)  # the user's number


def test_the_room_never_costs_the_one_request_that_must_fit() -> None:
    layout = make_layout("granite")
    need = -(-64 // layout.block_size) * len(layout.attention_group_ids) + 1
    live = 28 * layout.total_state_slot_bytes()
    tight = live + need * layout.page_bytes + 3 * layout.total_state_slot_bytes() + 5
    s = _sizing("granite", tight)
    assert s.checkpoint_room == 3 and s.num_blocks == need  # what is spare, not the budget
    assert _sizing("granite", live + need * layout.page_bytes).checkpoint_room == 0

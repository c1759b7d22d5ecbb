"""FaultInjection: reproducible decisions, rates, garbage over broken parts, delays, timeouts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridkv.connectors.config import OptionsContext
from hybridkv.connectors.fault.connector import FaultInjectionWorker
from hybridkv.connectors.fault.plan import FaultConfig, plan_faults
from hybridkv.connectors.registry import parse_kv_transfer_config
from hybridkv.step_io import KVConnectorOutput, LoadSpec
from tests.support.stats import flat_counters

from .helpers import Engine, fault_config, file_config, make_layout, make_request, table

SRC_TABLES = {0: [1, 2, 3, 4, 5], 1: [6, 7, 8, 9, 10]}
DST_TABLES = {0: [11, 12, 13, 14, 15], 1: [0, 0, 16, 17, 18]}
DST_IDS = [11, 12, 13, 14, 16, 17]
SRC_OF = {11: 1, 12: 2, 13: 3, 14: 4, 16: 8, 17: 9}


def config(**faults: Any) -> FaultConfig:
    return FaultConfig.parse({"inner": file_config("/unused"), **faults}, OptionsContext(16))


def big_spec(rid: str = "r", num_blocks: int = 2000) -> LoadSpec:
    ids = list(range(1, num_blocks + 1))
    return LoadSpec(rid, 0, num_blocks * 4, (ids,), (list(range(num_blocks)),), (), True, None)


def test_decisions_are_reproducible_and_depend_on_the_seed() -> None:
    spec = big_spec()
    first = plan_faults(config(block_failure_rate=0.1, seed=7), spec, ())
    again = plan_faults(config(block_failure_rate=0.1, seed=7), spec, ())
    other = plan_faults(config(block_failure_rate=0.1, seed=8), spec, ())
    assert first.blocks and first.blocks == again.blocks
    assert first.blocks != other.blocks
    # another request id, same blocks: other decisions too
    assert (
        plan_faults(config(block_failure_rate=0.1, seed=7), big_spec("s"), ()).blocks
        != first.blocks
    )


def test_rates_are_roughly_right() -> None:
    plan = plan_faults(config(block_failure_rate=0.1, corrupt_rate=0.2), big_spec(), ())
    reasons = list(plan.blocks.values())
    assert 0.07 < reasons.count("injected") / 2000 < 0.13
    assert 0.14 < reasons.count("corrupt") / 2000 < 0.22  # 0.2 of the 0.9 not failed
    failed = sum(
        plan_faults(config(request_failure_rate=0.3), big_spec(f"r{i}", 1), ()).request_reason
        is not None
        for i in range(1000)
    )
    assert 250 < failed < 350
    assert not plan_faults(config(), big_spec(), ()).blocks


def saved_dir(tmp_path: Path) -> Engine:
    layout = make_layout("hybrid")
    src = Engine(file_config(tmp_path), layout, seed=1)
    src.save_prompt(make_request("a", 18), table(layout, SRC_TABLES, {2: 0}), chunks=[16, 18])
    return src


def run_load(
    tmp_path: Path, src: Engine, mode: str, **faults: Any
) -> tuple[Engine, KVConnectorOutput]:
    dst = Engine(fault_config(tmp_path, {"load_mode": mode}, **faults), src.layout, seed=2)
    num, _, _ = dst.load(make_request("b", 18), table(src.layout, DST_TABLES, {2: 3}))
    assert num == 16
    out = dst.finish("b") if mode == "async" else dst.worker.get_finished([])
    return dst, out


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_failed_blocks_are_reported_and_overwritten_with_garbage(tmp_path: Path, mode: str) -> None:
    src = saved_dir(tmp_path)
    dst, out = run_load(tmp_path, src, mode, block_failure_rate=0.4, corrupt_rate=0.3, seed=3)
    _, again = run_load(tmp_path, src, mode, block_failure_rate=0.4, corrupt_rate=0.3, seed=3)
    assert out.invalid_block_ids and out.invalid_block_ids == again.invalid_block_ids
    assert set(out.invalid_block_ids.values()) <= {"injected", "corrupt"}
    assert out.invalid_state == again.invalid_state
    for block_id in DST_IDS:
        same = torch.equal(dst.blocks_bytes([block_id]), src.blocks_bytes([SRC_OF[block_id]]))
        assert same == (block_id not in out.invalid_block_ids), block_id
    assert torch.equal(dst.state_bytes(3), src.state_bytes(0)) == ("b" not in out.invalid_state)
    counters = flat_counters(dst.worker.take_stats())
    broken = len(out.invalid_block_ids) + len(out.invalid_state)
    assert (
        counters.get("injected_failures:injected", 0) + counters.get("injected_failures:corrupt", 0)
        == broken
    )
    assert counters["load_blocks"] == 6  # the inner's own counters come through


def test_failed_state_gets_garbage_and_an_invalid_state_entry(tmp_path: Path) -> None:
    src = saved_dir(tmp_path)
    dst, out = run_load(tmp_path, src, "sync", block_failure_rate=1.0)
    assert out.invalid_state == {"b": "injected"}
    assert set(out.invalid_block_ids) == set(DST_IDS)
    assert not torch.equal(dst.state_bytes(3), src.state_bytes(0))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_request_failure_fails_the_whole_request(tmp_path: Path, mode: str) -> None:
    src = saved_dir(tmp_path)
    dst, out = run_load(tmp_path, src, mode, request_failure_rate=1.0)
    assert out.failed_recving == {"b": "injected"}
    assert ("b" in out.finished_recving) == (mode == "async")
    for block_id in DST_IDS:
        assert not torch.equal(dst.blocks_bytes([block_id]), src.blocks_bytes([SRC_OF[block_id]]))
    assert not torch.equal(dst.state_bytes(3), src.state_bytes(0))


def test_delay_holds_back_completion(tmp_path: Path) -> None:
    src = saved_dir(tmp_path)
    began = time.monotonic()
    dst = Engine(fault_config(tmp_path, delay_seconds=0.3), src.layout, seed=2)
    dst.load(make_request("b", 18), table(src.layout, DST_TABLES, {2: 3}))
    dst.file_worker().wait_for_progress(5.0)  # the inner load is done ...
    assert dst.worker.get_finished([]).is_empty  # ... but not reported yet
    assert dst.worker.has_pending()
    out = dst.finish("b")
    assert time.monotonic() - began >= 0.3
    assert not (out.failed_recving or out.invalid_block_ids or out.invalid_state)
    assert torch.equal(dst.blocks_bytes([11]), src.blocks_bytes([1]))
    assert not dst.worker.has_pending()


def test_delay_beyond_the_timeout_fails_with_timeout(tmp_path: Path) -> None:
    src = saved_dir(tmp_path)
    began = time.monotonic()
    dst = Engine(fault_config(tmp_path, delay_seconds=5.0, load_timeout_seconds=0.2), src.layout)
    dst.load(make_request("b", 18), table(src.layout, DST_TABLES, {2: 3}))
    out = dst.finish("b")
    assert 0.2 <= time.monotonic() - began < 2.0
    assert out.failed_recving == {"b": "timeout"}
    assert not torch.equal(dst.blocks_bytes([11]), src.blocks_bytes([1]))
    assert flat_counters(dst.worker.take_stats())["injected_failures:timeout"] == 1


def test_scheduler_half_is_the_inner_one(tmp_path: Path) -> None:
    src = saved_dir(tmp_path)
    dst = Engine(fault_config(tmp_path, block_failure_rate=1.0), src.layout)
    assert dst.scheduler.get_num_new_matched_tokens(make_request("b", 18), 0) == (16, True)
    assert isinstance(dst.worker, FaultInjectionWorker)


@pytest.mark.parametrize(
    ("faults", "key"),
    [
        ({"colour": 1}, "colour"),
        ({"block_failure_rate": 1.5}, "block_failure_rate"),
        ({"request_failure_rate": -0.1}, "request_failure_rate"),
        ({"corrupt_rate": "high"}, "corrupt_rate"),
        ({"delay_seconds": -1}, "delay_seconds"),
        ({"load_timeout_seconds": 0}, "load_timeout_seconds"),
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
        # finding 16 (issue 18): NaN passes every range check, infinity a lower bound
        ({"block_failure_rate": float("nan")}, "block_failure_rate"),
        ({"corrupt_rate": float("nan")}, "corrupt_rate"),
        ({"delay_seconds": float("inf")}, "delay_seconds"),
        ({"delay_seconds": float("nan")}, "delay_seconds"),
        ({"load_timeout_seconds": float("nan")}, "load_timeout_seconds"),
        ({"load_timeout_seconds": float("inf")}, "load_timeout_seconds"),
        ({"block_failure_rate": True}, "block_failure_rate"),
    ],
)
def test_bad_config_names_the_key(faults: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        config(**faults)


def test_bad_inner_config_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="inner"):
        FaultConfig.parse({"block_failure_rate": 0.1}, OptionsContext(16))
    with pytest.raises(ValueError, match="inner"):
        FaultConfig.parse({"inner": {"kv_role": "kv_both"}}, OptionsContext(16))
    with pytest.raises(ValueError, match="NoSuchConnector"):
        Engine(
            {
                "kv_connector": "FaultInjection",
                "kv_connector_extra_config": {"inner": {"kv_connector": "NoSuchConnector"}},
            },
            make_layout(),
        )
    with pytest.raises(ValueError, match="load_mode"):
        Engine(fault_config(tmp_path, {"load_mode": "never"}), make_layout())
    assert parse_kv_transfer_config(fault_config(tmp_path), 16).kv_connector == "FaultInjection"

"""Unit boundaries, what a save holds, and the lookup rules per layout kind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridkv.connectors.offloading.units import UnitGeometry, UnitSave
from tests.connectors.helpers import make_layout, make_request, table

from .helpers import DST, SRC, OffloadEngine, offload_config


def saved(layout_name: str = "hybrid", chunks: tuple[int, ...] = (8, 16, 18), **kw: object):
    layout = make_layout(layout_name)
    engine = OffloadEngine(offload_config(**kw), layout, seed=1)  # type: ignore[arg-type]
    req = make_request("a", 18)
    tables = {g: SRC[g] for g in layout.attention_group_ids}
    engine.save_prompt(
        req, table(layout, tables, dict.fromkeys(layout.state_group_ids, 0)), list(chunks)
    )
    return engine, req


def test_geometry_of_a_hybrid_unit() -> None:
    geo = UnitGeometry(make_layout("hybrid"), 8)
    assert list(geo.part_blocks(0, 16)) == [2, 3]  # full: the chunk's own blocks
    assert list(geo.part_blocks(1, 8)) == [0, 1]  # sliding: window ending at 8 (tokens 1..7)
    assert list(geo.part_blocks(1, 16)) == [2, 3]  # tokens 9..15
    assert list(geo.part_blocks(2, 16)) == []  # state
    layout = geo.layout
    assert geo.unit_nbytes(16) == 4 * layout.page_bytes + layout.state_slot_bytes(2)
    assert geo.unit_end_of_block(3) == 16 and geo.unit_end_of_block(4) == 24


def test_saves_one_unit_per_reached_end_with_its_parts() -> None:
    layout = make_layout("hybrid")
    engine = OffloadEngine(offload_config(), layout)
    req = make_request("a", 18)
    blocks = table(layout, SRC, {2: 0})
    meta = engine.scheduler.build_connector_meta([(req, 0, 8, blocks)])
    (save,) = meta.saves
    assert isinstance(save, UnitSave)
    assert (save.end, save.block_ids, save.state_slots, save.tiers) == (
        8,
        ((1, 2), (6, 7)),
        (0,),
        ("cpu",),
    )
    assert save.unit_hash == req.block_hashes[1]
    # a step that passes a unit end without ending there cannot save the state at it
    assert engine.scheduler.build_connector_meta([(req, 8, 18, blocks)]).saves == []
    assert engine.scheduler.get_step_interval(req) == 8
    engine.worker.save(meta)
    assert engine.offload_worker.wait_for_saves(5.0)
    engine.assert_clean()


def test_full_attention_only_saves_every_unit_a_step_passes() -> None:
    layout = make_layout("full")
    engine = OffloadEngine(offload_config(), layout)
    req = make_request("a", 18)
    meta = engine.scheduler.build_connector_meta([(req, 0, 18, table(layout, {0: SRC[0]}))])
    assert [s.end for s in meta.saves] == [8, 16]
    engine.worker.save(meta)
    engine.offload_worker.wait_for_saves(5.0)


def test_decode_tokens_only_by_option() -> None:
    layout = make_layout("full")
    for prompt_only, ends in ((True, []), (False, [16, 24])):
        engine = OffloadEngine(offload_config(offload_prompt_only=prompt_only), layout)
        req = make_request("a", 10)
        req.append([5] * 16)  # 26 tokens, prompt 10
        blocks = table(layout, {0: list(range(1, 8))})
        meta = engine.scheduler.build_connector_meta([(req, 10, 26, blocks)])
        assert [s.end for s in meta.saves] == ends


def test_round_trip_bytes_into_other_blocks() -> None:
    src, _ = saved()
    before = src.blocks_bytes([1, 2, 3, 4, 8, 9]).clone(), src.state_bytes(0).clone()
    dst = src  # the same engine: loads land in blocks 11.. and slot 3
    req = make_request("b", 18)
    num, is_async, meta = dst.load(req, table(src.layout, DST, {2: 3}))
    assert (num, is_async) == (16, True)
    assert meta.loads[0].block_indices == ([0, 1, 2, 3], [2, 3])
    out = dst.finish("b")
    assert not (out.failed_recving or out.invalid_block_ids or out.invalid_state)
    assert torch.equal(dst.blocks_bytes([11, 12, 13, 14, 16, 17]), before[0])
    assert torch.equal(dst.state_bytes(3), before[1])
    assert not torch.equal(dst.blocks_bytes([15]), dst.blocks_bytes([5]))  # not loaded
    assert dst.scheduler.get_hit_sources(req, 16) == {"cpu": 16}
    src.assert_clean()


def lookup(layout: str, local: int = 0, n: int = 18, chunks: tuple[int, ...] = (8, 16, 18)):
    engine, _ = saved(layout, chunks)
    return engine.scheduler.get_num_new_matched_tokens(make_request("q", n), local)


@pytest.mark.parametrize(
    ("layout", "local", "n", "expected"),
    [
        ("full", 0, 18, (16, True)),
        ("full", 0, 16, (16, True)),  # full attention only: T = N (the scheduler clamps)
        ("full", 4, 18, (12, True)),  # local hit inside unit 1: its later blocks still load
        ("full", 16, 18, (0, False)),
        ("full_swa", 0, 16, (8, True)),  # a window layout stops at N-1
        ("full_swa", 8, 18, (8, True)),
        ("full_state", 0, 18, (16, True)),
        ("hybrid", 0, 17, (16, True)),
        ("hybrid", 0, 16, (8, True)),
        ("hybrid", 12, 18, (4, True)),
    ],
)
def test_lookup_rules(layout: str, local: int, n: int, expected: tuple[int, bool]) -> None:
    assert lookup(layout, local, n) == expected


def test_lookup_stops_at_a_missing_unit_and_needs_every_earlier_one() -> None:
    engine, req = saved("hybrid")
    engine.cpu.index.remove(req.block_hashes[1])  # unit ending at 8
    assert engine.scheduler.get_num_new_matched_tokens(make_request("q", 18), 0) == (0, False)
    assert engine.scheduler.get_num_new_matched_tokens(make_request("q", 18), 8) == (8, True)


def test_unit_being_stored_means_ask_later() -> None:
    layout = make_layout("hybrid")
    engine = OffloadEngine(offload_config(), layout)
    req = make_request("a", 18)
    meta = engine.scheduler.build_connector_meta([(req, 0, 8, table(layout, SRC, {2: 0}))])
    assert meta.saves  # reserved: pending until the worker commits it
    assert engine.scheduler.get_num_new_matched_tokens(make_request("q", 18), 0) is None
    engine.worker.save(meta)
    engine.offload_worker.wait_for_saves(5.0)
    assert engine.scheduler.get_num_new_matched_tokens(make_request("q", 18), 0) == (8, True)


def test_sync_load_mode_and_roles(tmp_path: Path) -> None:
    engine, _ = saved("full", load_mode="sync")
    assert engine.scheduler.get_num_new_matched_tokens(make_request("q", 18), 0) == (16, False)
    producer = OffloadEngine({**offload_config(), "kv_role": "kv_producer"}, make_layout("full"))
    assert producer.scheduler.get_num_new_matched_tokens(make_request("q", 18), 0) == (0, False)
    consumer = OffloadEngine({**offload_config(), "kv_role": "kv_consumer"}, make_layout("full"))
    blocks = table(consumer.layout, {0: SRC[0]})
    assert (
        consumer.scheduler.build_connector_meta([(make_request("a", 18), 0, 8, blocks)]).saves == []
    )

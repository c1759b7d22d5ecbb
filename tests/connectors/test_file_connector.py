"""FileConnector: round trips, lookup rules, isolation by fingerprint, restarts, bad files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from hybridkv.connectors.file.format import write_part
from hybridkv.connectors.file.store import FileLoadKeys, FileStore, block_key, state_key
from tests.support.stats import flat_counters

from .helpers import (
    Engine,
    FakeRequest,
    file_config,
    make_layout,
    make_request,
    stored_files,
    table,
)

# hybrid layout: g0 full attention, g1 sliding window (W=8), g2 state; B=4.
# A prompt of 18 tokens has 4 full blocks; the scheduler ends a chunk at 16 (last boundary).
SRC_TABLES = {0: [1, 2, 3, 4, 5], 1: [6, 7, 8, 9, 10]}
DST_TABLES = {0: [11, 12, 13, 14, 15], 1: [0, 0, 16, 17, 18]}  # out-of-window entries are null


def saved_engine(tmp_path: Path, **extra: object) -> tuple[Engine, FakeRequest]:
    layout = make_layout("hybrid")
    src = Engine(file_config(tmp_path, **extra), layout, seed=1)
    req = make_request("a", 18)
    src.save_prompt(req, table(layout, SRC_TABLES, {2: 0}), chunks=[8, 16, 18])
    return src, req


def load_into_new_engine(tmp_path: Path, mode: str) -> tuple[Engine, Engine, FakeRequest]:
    src, _ = saved_engine(tmp_path)
    layout = src.layout
    dst = Engine(file_config(tmp_path, load_mode=mode), layout, seed=2)  # a restart: new index
    req = make_request("b", 18)
    num, is_async, meta = dst.load(req, table(layout, DST_TABLES, {2: 3}))
    assert (num, is_async) == (16, mode == "async")
    assert meta.loads[0].block_indices == ([0, 1, 2, 3], [2, 3])
    return src, dst, req


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_round_trip_restores_identical_bytes_elsewhere(tmp_path: Path, mode: str) -> None:
    src, dst, req = load_into_new_engine(tmp_path, mode)
    if mode == "async":
        out = dst.finish("b")
    else:
        out = dst.worker.get_finished([])
        assert not out.finished_recving  # sync loads are not waited for
    assert not (out.failed_recving or out.invalid_block_ids or out.invalid_state)
    assert torch.equal(dst.blocks_bytes([11, 12, 13, 14]), src.blocks_bytes([1, 2, 3, 4]))
    assert torch.equal(dst.blocks_bytes([16, 17]), src.blocks_bytes([8, 9]))
    assert torch.equal(dst.state_bytes(3), src.state_bytes(0))
    assert not torch.equal(dst.blocks_bytes([15]), src.blocks_bytes([5]))  # not loaded
    stats = flat_counters(dst.worker.take_stats())
    assert stats["load_blocks"] == 6 and stats["load_states"] == 1
    assert stats[
        "offload_bytes.disk.load"
    ] == 6 * src.layout.page_bytes + src.layout.state_slot_bytes(2)
    assert not dst.worker.has_pending()
    dst.worker.shutdown()


def test_saves_only_full_prompt_blocks_and_states_at_prompt_boundaries(tmp_path: Path) -> None:
    src, req = saved_engine(tmp_path)
    store_dir = tmp_path / "fp-a"
    names = sorted(str(p.relative_to(store_dir)) for p in stored_files(store_dir))
    h = [x.hex() for x in req.block_hashes]
    expected = [f"g0/{h[k]}.kv" for k in range(4)] + [f"g1/{h[k]}.kv" for k in range(4)]
    expected += [f"g2/{h[1]}.state", f"g2/{h[3]}.state"]  # chunks ended at 8 and 16
    assert names == sorted(expected)
    counters = flat_counters(src.worker.take_stats())
    assert counters["store_blocks"] == 8 and counters["store_states"] == 2
    # everything is stored now: the same step again plans no saves at all
    meta = src.scheduler.build_connector_meta([(req, 0, 16, table(src.layout, SRC_TABLES, {2: 0}))])
    assert meta.saves == []


def test_output_tokens_are_never_saved(tmp_path: Path) -> None:
    layout = make_layout("hybrid")
    engine = Engine(file_config(tmp_path), layout)
    req = make_request("a", 18)
    req.append([7] * 10)  # 28 tokens: blocks 4..6 hold output tokens
    blocks = table(layout, {0: [1, 2, 3, 4, 5, 6, 7], 1: [0, 0, 0, 11, 12, 13, 14]}, {2: 0})
    assert engine.scheduler.build_connector_meta([(req, 18, 28, blocks)]).saves == []
    meta = engine.scheduler.build_connector_meta([(req, 8, 20, blocks)])
    assert [(s.block_ids, s.state_keys) for s in meta.saves] == [([3, 4, 11], [])]


def put(store: FileStore, keys: list[str]) -> None:
    for key in keys:
        store.prepare_dir(key)
        write_part(store.path(key), store.fingerprint, key, (0, 0), b"x")
    store.rebuild_index()


def lookup(
    tmp_path: Path,
    layout_name: str,
    blocks: dict[int, list[int]],
    states: list[int],
    num_tokens: int,
    local: int = 0,
    **extra: object,
) -> tuple[int, bool] | None:
    layout = make_layout(layout_name)
    engine = Engine(file_config(tmp_path, **extra), layout)
    req = make_request("r", num_tokens)
    store = engine.file_worker().store
    keys = [block_key(g, req.block_hashes[k]) for g, ks in blocks.items() for k in ks]
    keys += [
        state_key(g, req.block_hashes[t // 4 - 1]) for g in layout.state_group_ids for t in states
    ]
    put(store, keys)
    return engine.scheduler.get_num_new_matched_tokens(req, local)


def test_lookup_full_attention_only(tmp_path: Path) -> None:
    assert lookup(tmp_path / "1", "full", {0: [0, 1, 2]}, [], 18) == (12, True)
    assert lookup(tmp_path / "2", "full", {0: [0, 1, 2, 3]}, [], 18) == (16, True)
    assert lookup(tmp_path / "3", "full", {0: [0, 1, 2, 3]}, [], 16) == (16, True)  # T = N
    assert lookup(tmp_path / "4", "full", {0: [0, 2, 3]}, [], 18) == (4, True)  # gap at 1
    assert lookup(tmp_path / "5", "full", {0: [1, 2]}, [], 18, local=4) == (8, True)
    assert lookup(tmp_path / "6", "full", {0: [0, 1, 2]}, [], 18, local=12) == (0, False)
    assert lookup(tmp_path / "7", "full", {0: [0, 1]}, [], 18, load_mode="sync") == (8, False)


def test_lookup_sliding_window_needs_only_the_window(tmp_path: Path) -> None:
    fa = {0: [0, 1, 2, 3]}
    # window ending at 16 with W=8 covers tokens 9..15: blocks 2 and 3
    assert lookup(tmp_path / "1", "full_swa", {**fa, 1: [2, 3]}, [], 18) == (16, True)
    assert lookup(tmp_path / "2", "full_swa", {**fa, 1: [3]}, [], 18) == (0, False)
    assert lookup(tmp_path / "3", "full_swa", {**fa, 1: [0, 1]}, [], 18) == (8, True)
    # blocks before the local hit come from the local cache
    assert lookup(tmp_path / "4", "full_swa", {**fa, 1: [3]}, [], 18, local=12) == (4, True)


def test_lookup_with_state_needs_a_state_at_t_and_caps_at_n_minus_1(tmp_path: Path) -> None:
    fa = {0: [0, 1, 2, 3]}
    assert lookup(tmp_path / "1", "full_state", fa, [8], 18) == (8, True)
    assert lookup(tmp_path / "2", "full_state", fa, [], 18) == (0, False)
    assert lookup(tmp_path / "3", "full_state", fa, [12, 16], 16) == (12, True)  # N-1 = 15
    assert lookup(tmp_path / "4", "full_state", {0: [0, 1]}, [4, 12], 18) == (4, True)
    assert lookup(tmp_path / "5", "hybrid", {**fa, 1: [1, 2, 3]}, [16], 18, local=8) == (8, True)


def test_another_fingerprint_sees_nothing_and_overwrites_nothing(tmp_path: Path) -> None:
    src, req = saved_engine(tmp_path)
    before = {p: p.read_bytes() for p in stored_files(tmp_path)}
    other = Engine(file_config(tmp_path), src.layout, fingerprint="fp-b", seed=5)
    again = make_request("b", 18)
    assert other.scheduler.get_num_new_matched_tokens(again, 0) == (0, False)
    other.save_prompt(again, table(src.layout, SRC_TABLES, {2: 0}), chunks=[16])
    assert all(p.read_bytes() == data for p, data in before.items())
    assert len(stored_files(tmp_path / "fp-b")) == 9  # 4 + 4 blocks and a state at 16


def test_role_and_save_options(tmp_path: Path) -> None:
    layout = make_layout("full")
    reader = Engine(file_config(tmp_path, save=False), layout)
    req = make_request("a", 8)
    reader.save_prompt(req, table(layout, {0: [1, 2]}), chunks=[8])
    assert stored_files(tmp_path) == []
    cfg = file_config(tmp_path)
    producer = Engine({**cfg, "kv_role": "kv_producer"}, layout)
    producer.save_prompt(req, table(layout, {0: [1, 2]}), chunks=[8])
    assert len(stored_files(tmp_path)) == 2
    assert producer.scheduler.get_num_new_matched_tokens(req, 0) == (0, False)
    assert Engine(cfg, layout).scheduler.get_num_new_matched_tokens(req, 0) == (8, True)


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flip":
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif how == "truncate":
        path.write_bytes(data[: len(data) - 100])
    elif how == "delete":
        path.unlink()
    elif how == "magic":
        path.write_bytes(b"XXXX" + data[4:])


@pytest.mark.parametrize(
    ("how", "reason", "removed"),
    [
        ("flip", "corrupt", 1),
        ("truncate", "truncated", 1),
        ("delete", "missing", 0),
        ("magic", "corrupt", 1),
    ],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_bad_block_file_is_a_counted_failure_and_removed(
    tmp_path: Path, how: str, reason: str, removed: int, mode: str
) -> None:
    src, req = saved_engine(tmp_path)
    dst = Engine(file_config(tmp_path, load_mode=mode), src.layout, seed=2)
    victim = tmp_path / "fp-a" / block_key(0, req.block_hashes[2])
    damage(victim, how)  # after start-up: the index still lists the file
    num, _, _ = dst.load(make_request("b", 18), table(src.layout, DST_TABLES, {2: 3}))
    assert num == 16  # the failure shows at load time
    out = dst.finish("b") if mode == "async" else dst.worker.get_finished([])
    assert out.invalid_block_ids == {13: reason}
    assert not out.failed_recving and not out.invalid_state
    assert torch.equal(dst.blocks_bytes([11, 12, 14]), src.blocks_bytes([1, 2, 4]))
    assert not victim.exists()
    counters = flat_counters(dst.worker.take_stats())
    assert counters[f"load_failures:{reason}"] == 1
    assert counters.get("files_removed", 0) == removed
    assert counters["load_blocks"] == 5
    # the index forgot the file: the next lookup stops before block 2
    assert dst.scheduler.get_num_new_matched_tokens(make_request("c", 18), 0) == (
        8,
        mode == "async",
    )


def test_bad_state_file_reports_the_state_part(tmp_path: Path) -> None:
    src, req = saved_engine(tmp_path)
    damage(tmp_path / "fp-a" / state_key(2, req.block_hashes[3]), "flip")
    dst = Engine(file_config(tmp_path, load_mode="sync"), src.layout, seed=2)
    dst.load(make_request("b", 18), table(src.layout, DST_TABLES, {2: 3}))
    out = dst.worker.get_finished([])
    assert out.invalid_state == {"b": "corrupt"} and not out.invalid_block_ids
    assert flat_counters(dst.worker.take_stats())["files_removed"] == 1


def test_file_under_another_key_is_a_mismatch(tmp_path: Path) -> None:
    src, req = saved_engine(tmp_path)
    root = tmp_path / "fp-a"
    a, b = root / block_key(0, req.block_hashes[0]), root / block_key(0, req.block_hashes[1])
    b.write_bytes(a.read_bytes())
    dst = Engine(file_config(tmp_path, load_mode="sync"), src.layout, seed=2)
    dst.load(make_request("b", 18), table(src.layout, DST_TABLES, {2: 3}))
    assert dst.worker.get_finished([]).invalid_block_ids == {12: "mismatch"}


def test_load_spec_carries_file_keys(tmp_path: Path) -> None:
    _, dst, req = load_into_new_engine(tmp_path, "sync")
    # covered by the round trip; here the plain-data keys the worker receives
    meta_keys = FileLoadKeys(
        (
            [block_key(0, req.block_hashes[k]) for k in range(4)],
            [block_key(1, req.block_hashes[k]) for k in (2, 3)],
        ),
        (state_key(2, req.block_hashes[3]),),
    )
    dst2 = Engine(file_config(tmp_path, load_mode="sync"), dst.layout, seed=3)
    _, _, meta = dst2.load(make_request("c", 18), table(dst.layout, DST_TABLES, {2: 1}))
    assert meta.loads[0].keys == meta_keys
    assert (meta.loads[0].start, meta.loads[0].end, meta.loads[0].state_slots) == (0, 16, (1,))


def test_atomic_writes_leave_no_temp_files_and_failed_writes_stay_invisible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved_engine(tmp_path / "ok")
    assert not [p for p in (tmp_path / "ok").rglob("*") if p.name.endswith(".tmp")]

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    src, req = saved_engine(tmp_path / "broken")
    monkeypatch.undo()
    assert stored_files(tmp_path / "broken") == []
    counters = flat_counters(src.worker.take_stats())
    assert counters["store_failures"] == 10 and "store_blocks" not in counters
    assert src.scheduler.get_num_new_matched_tokens(make_request("b", 18), 0) == (0, False)


def test_startup_removes_stale_temp_files_only(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path), "fp")
    os.makedirs(tmp_path / "fp" / "g0")
    old, young = tmp_path / "fp" / "g0" / ".x.kv.1.tmp", tmp_path / "fp" / "g0" / ".y.kv.2.tmp"
    old.write_bytes(b"x")
    young.write_bytes(b"y")
    os.utime(old, (1, 1))
    store.rebuild_index()
    assert not old.exists() and young.exists() and len(store) == 0


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"path": "/tmp/x", "colour": 1}, "colour"),
        ({}, "path"),
        ({"path": ""}, "path"),
        ({"path": "/tmp/x", "load_mode": "eager"}, "load_mode"),
        ({"path": "/tmp/x", "save": "yes"}, "save"),
    ],
)
def test_bad_config_names_the_key(extra: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        Engine({"kv_connector": "FileConnector", "kv_connector_extra_config": extra}, make_layout())


def test_concurrent_async_loads_each_land_in_their_own_blocks(tmp_path: Path) -> None:
    src, _ = saved_engine(tmp_path)
    dst = Engine(file_config(tmp_path), src.layout, seed=2)
    tables = [
        ({0: [b, b + 1, b + 2, b + 3, b + 4], 1: [0, 0, b + 5, b + 6, b + 7]}, b // 10)
        for b in (11, 21, 31)
    ]
    for i, (tables_i, slot) in enumerate(tables):
        dst.load(make_request(f"r{i}", 18), table(src.layout, tables_i, {2: slot}))
    out = dst.finish("r0", "r1", "r2")
    assert out.finished_recving == {"r0", "r1", "r2"} and not out.invalid_block_ids
    for tables_i, slot in tables:
        assert torch.equal(dst.blocks_bytes(tables_i[0][:4]), src.blocks_bytes([1, 2, 3, 4]))
        assert torch.equal(dst.blocks_bytes(tables_i[1][2:4]), src.blocks_bytes([8, 9]))
        assert torch.equal(dst.state_bytes(slot), src.state_bytes(0))
    dst.worker.shutdown()

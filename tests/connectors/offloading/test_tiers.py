"""Eviction order, CPU -> disk, restarts, foreign layouts, bad bytes, timeouts, backpressure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from hybridkv.connectors.offloading.policies import ARCPolicy, LRUPolicy
from hybridkv.connectors.offloading.tiers.disk.tier import DiskTier
from tests.connectors.helpers import FakeRequest, make_layout, make_request, stored_files, table
from tests.support.lifetimes import track
from tests.support.waits import Gate, wait_for

from .helpers import DST, SRC, OffloadEngine, offload_config

UNIT = 2048  # "full" layout: one group of 2 layers, 1024-byte blocks, 2 blocks per unit


def full_engine(**kw: object) -> OffloadEngine:
    return OffloadEngine(offload_config(**kw), make_layout("full"))  # type: ignore[arg-type]


def store(engine: OffloadEngine, req: FakeRequest, first_block: int = 1) -> None:
    n = -(-req.num_tokens // 4)
    blocks = table(engine.layout, {0: list(range(first_block, first_block + n))})
    engine.save_prompt(req, blocks, [req.num_tokens])


def hit(engine: OffloadEngine, req: FakeRequest) -> int:
    found = engine.scheduler.get_num_new_matched_tokens(FakeRequest("q", req.all_token_ids), 0)
    assert found is not None
    return found[0]


def test_lru_evicts_a_prefix_tail_before_its_head() -> None:
    engine = full_engine(cpu=3 * UNIT)
    a, b = make_request("a", 18, first_token=1), make_request("b", 26, first_token=500)
    store(engine, a)
    store(engine, b, first_block=10)
    # room for 3 units: B's 2nd unit evicted A's tail (16), its 3rd A's head (8)
    assert hit(engine, a) == 0 and hit(engine, b) == 24
    assert engine.counters()["evictions.cpu"] == 2
    engine.assert_clean()
    engine2 = full_engine(cpu=2 * UNIT)
    store(engine2, a)
    store(engine2, make_request("c", 10, first_token=900), first_block=10)
    assert hit(engine2, a) == 8  # only the tail went


def load_all(engine: OffloadEngine, req: FakeRequest, rid: str = "l") -> int:
    n = -(-req.num_tokens // 4)
    clone = FakeRequest(rid, req.all_token_ids)
    num, _, _ = engine.load(clone, table(engine.layout, {0: list(range(40, 40 + n))}))
    engine.finish(rid)
    return num


@pytest.mark.parametrize(("policy", "survives"), [("lru", False), ("arc", True)])
def test_arc_keeps_a_reused_prefix_through_a_scan(policy: str, survives: bool) -> None:
    engine = full_engine(cpu=4 * UNIT, eviction=policy)
    a = make_request("a", 18)
    store(engine, a)
    assert load_all(engine, a) == 16  # a second use of both units
    for i in range(3):  # a scan of one-time prompts, 2 units each
        store(engine, make_request(f"s{i}", 18, first_token=200 * (i + 1)), first_block=10)
    assert (hit(engine, a) == 16) is survives
    engine.assert_clean()


def test_policies_order_and_ghosts() -> None:
    lru = LRUPolicy(4)
    for k in "abc":
        lru.insert(k)
    lru.touch("a")
    assert lru.candidates() == ["b", "c", "a"]
    arc = ARCPolicy(2)
    arc.insert("a")
    arc.insert("b")
    arc.touch("a", reuse=True)  # a -> T2
    assert arc.candidates() == ["b", "a"]
    arc.remove("b", evicted=True)  # ghost in B1
    arc.insert("b")  # B1 ghost hit: T1 target grows, b goes to T2
    assert arc.p == 1.0 and set(arc.t2) == {"a", "b"}
    arc.touch("a", reuse=False)
    assert arc.candidates() == ["b", "a"]


def test_pinned_units_are_never_evicted() -> None:
    engine = full_engine(cpu=2 * UNIT)
    a = make_request("a", 18)
    store(engine, a)
    index = engine.cpu.index
    head, tail = index.pin(a.block_hashes[1]), index.pin(a.block_hashes[3])
    assert head and tail
    store(engine, make_request("b", 10, first_token=300), first_block=10)
    counters = engine.counters()
    assert counters["stores_skipped:no_room"] == 1 and "evictions.cpu" not in counters
    index.unpin(a.block_hashes[1], head)
    index.unpin(a.block_hashes[3], tail)
    engine.assert_clean()


def test_cpu_eviction_leaves_the_unit_on_disk_and_loads_mix_tiers(tmp_path: Path) -> None:
    engine = full_engine(cpu=UNIT, disk=tmp_path)
    a = make_request("a", 18)
    engine.save_prompt(a, table(engine.layout, {0: [1, 2, 3, 4, 5]}), [8, 18])
    assert engine.cpu.index.state_of(a.block_hashes[1]) is None  # evicted from CPU
    assert len(stored_files(tmp_path)) == 2  # write-through: both units on disk
    before = engine.blocks_bytes([1, 2, 3, 4]).clone()
    req = FakeRequest("l", a.all_token_ids)
    num, _, _ = engine.load(req, table(engine.layout, {0: [40, 41, 42, 43, 44]}))
    assert num == 16 and engine.scheduler.get_hit_sources(req, 16) == {"disk": 8, "cpu": 8}
    out = engine.finish("l")
    assert not out.invalid_block_ids and torch.equal(engine.blocks_bytes([40, 41, 42, 43]), before)
    counters = engine.counters()
    assert counters["hits.disk"] == 1 and counters["hits.cpu"] == 1
    assert counters["offload_bytes.disk.load"] == UNIT == counters["offload_bytes.cpu.load"]
    assert counters["offload_bytes.disk.store"] == 2 * UNIT
    engine.assert_clean()


def test_restart_rebuilds_the_index_and_other_fingerprints_see_nothing(tmp_path: Path) -> None:
    layout = make_layout("hybrid")
    first = OffloadEngine(offload_config(cpu=None, disk=tmp_path), layout, seed=1)
    a = make_request("a", 18)
    first.save_prompt(a, table(layout, SRC, {2: 0}), [8, 16, 18])
    want = first.blocks_bytes([1, 2, 3, 4, 8, 9]).clone(), first.state_bytes(0).clone()
    first.worker.shutdown()
    files = {p: p.read_bytes() for p in stored_files(tmp_path)}
    assert len(files) == 6  # 2 units x (full, sliding, state)
    again = OffloadEngine(offload_config(cpu=None, disk=tmp_path), layout, seed=2)
    req = FakeRequest("b", a.all_token_ids)
    num, _, _ = again.load(req, table(layout, DST, {2: 3}))
    assert num == 16 and not again.finish("b").invalid_block_ids
    assert torch.equal(again.blocks_bytes([11, 12, 13, 14, 16, 17]), want[0])
    assert torch.equal(again.state_bytes(3), want[1])
    other = OffloadEngine(offload_config(cpu=None, disk=tmp_path), layout, fingerprint="fp-b")
    assert other.scheduler.get_num_new_matched_tokens(FakeRequest("c", a.all_token_ids), 0) == (
        0,
        False,
    )
    other.save_prompt(FakeRequest("c", a.all_token_ids), table(layout, SRC, {2: 0}), [8, 16, 18])
    assert all(p.read_bytes() == data for p, data in files.items())
    assert len(stored_files(tmp_path / "fp-b")) == 6
    # a different chunk size of the same layout keeps to its own directory too
    c16 = OffloadEngine(offload_config(cpu=None, disk=tmp_path, chunk_tokens=16), layout)
    assert c16.scheduler.get_num_new_matched_tokens(FakeRequest("d", a.all_token_ids), 0) == (
        0,
        False,
    )


def test_startup_removes_truncated_files_and_incomplete_debris(tmp_path: Path) -> None:
    engine = full_engine(cpu=None, disk=tmp_path)
    a = make_request("a", 18)
    store(engine, a)
    head, tail = sorted(stored_files(tmp_path), key=lambda p: p.stat().st_mtime)
    tail.write_bytes(tail.read_bytes()[:100])
    rebuilt = track(DiskTier(str(tmp_path), "fp-a", 1 << 20, "lru", engine.disk.geometry))
    assert rebuilt.num_removed_at_startup == 1 and not tail.exists()
    assert len(rebuilt.index.entries) == 1


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flip":
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif how == "truncate":
        path.write_bytes(data[:-100])
    else:
        path.unlink()


@pytest.mark.parametrize(
    ("how", "reason"), [("flip", "corrupt"), ("truncate", "truncated"), ("delete", "missing")]
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_bad_disk_file_is_a_counted_failure_and_removed(
    tmp_path: Path, how: str, reason: str, mode: str
) -> None:
    engine = full_engine(cpu=None, disk=tmp_path, load_mode=mode)
    a = make_request("a", 18)
    store(engine, a)
    victim = Path(engine.disk.path(a.block_hashes[3], 0))
    damage(victim, how)
    req = FakeRequest("l", a.all_token_ids)
    num, _, _ = engine.load(req, table(engine.layout, {0: [40, 41, 42, 43, 44]}))
    assert num == 16
    out = engine.finish("l") if mode == "async" else engine.worker.get_finished([])
    assert out.invalid_block_ids == {42: reason, 43: reason} and not out.failed_recving
    assert engine.disk.drain(5.0)  # bad files are deleted on the I/O pool
    assert not victim.exists()
    counters = engine.counters()
    assert counters[f"load_failures:{reason}"] == 1
    assert hit(engine, a) == 8  # the bad unit left the index
    engine.assert_clean()


def test_corrupted_cpu_bytes_fail_their_checksum() -> None:
    engine = full_engine()
    a = make_request("a", 18)
    store(engine, a)
    part = engine.cpu.index.entries[a.block_hashes[1]].parts[0]
    part.data[0, 0, 5] ^= 1
    engine.load(FakeRequest("l", a.all_token_ids), table(engine.layout, {0: [40, 41, 42, 43, 44]}))
    out = engine.finish("l")
    assert out.invalid_block_ids == {40: "corrupt", 41: "corrupt"}
    assert engine.counters()["load_failures:corrupt"] == 1 and hit(engine, a) == 0


def test_slow_disk_times_out_and_late_bytes_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = full_engine(cpu=None, disk=tmp_path, load_timeout_seconds=0.1)
    a = make_request("a", 18)
    store(engine, a)
    slow_read, disk = DiskTier.read, Gate()

    def read(self: DiskTier, *args: object) -> torch.Tensor:
        disk.hold()  # until the load has timed out
        return slow_read(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(DiskTier, "read", read)
    before = engine.blocks_bytes([40, 41, 42, 43]).clone()
    engine.load(FakeRequest("l", a.all_token_ids), table(engine.layout, {0: [40, 41, 42, 43, 44]}))
    out = engine.finish("l", timeout=2.0)
    assert out.failed_recving == {"l": "timeout"} and disk.num_passed == 0
    disk.release()  # the late bytes arrive now
    assert engine.offload_worker.wait_for_saves(2.0)
    wait_for(lambda: not engine.disk.index.num_pinned(), what="the late reads to unpin")
    assert torch.equal(engine.blocks_bytes([40, 41, 42, 43]), before)  # never written
    counters = engine.counters()
    assert counters["timeouts"] == 1 and counters["load_failures:timeout"] == 1
    engine.assert_clean()


def test_sync_load_timeout_is_a_request_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = full_engine(cpu=None, disk=tmp_path, load_timeout_seconds=0.1, load_mode="sync")
    a = make_request("a", 18)
    store(engine, a)
    disk = Gate()
    monkeypatch.setattr(DiskTier, "read", lambda *args: disk.hold())
    engine.load(FakeRequest("l", a.all_token_ids), table(engine.layout, {0: [40, 41, 42, 43, 44]}))
    assert disk.num_passed == 0  # the step stopped waiting at the timeout, not for the read
    out = engine.worker.get_finished([])
    disk.release()
    assert out.failed_recving == {"l": "timeout"} and not out.finished_recving


def test_backpressure_skips_stores_and_counts_them() -> None:
    engine = full_engine(max_inflight_io_bytes=UNIT - 1)
    a = make_request("a", 18)
    store(engine, a)
    counters = engine.counters()
    assert counters["stores_skipped:backpressure"] == 2 and "stores.cpu" not in counters
    assert hit(engine, a) == 0
    engine.assert_clean()


def test_failed_disk_write_never_becomes_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = full_engine(cpu=None, disk=tmp_path)

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    a = make_request("a", 18)
    store(engine, a)
    monkeypatch.undo()
    assert stored_files(tmp_path) == [] and hit(engine, a) == 0
    assert engine.counters()["store_failures.disk"] == 2
    engine.assert_clean()


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"cpu_bytes": "1MiB", "colour": 1}, "colour"),
        ({}, "cpu_bytes"),
        ({"cpu_bytes": "lots"}, "cpu_bytes"),
        ({"disk_path": "/tmp/x"}, "disk_bytes"),
        ({"cpu_bytes": 1024, "chunk_tokens": 6}, "chunk_tokens"),
        ({"cpu_bytes": 1024, "chunk_tokens": 0}, "chunk_tokens"),
        ({"cpu_bytes": 1024, "eviction": "fifo"}, "eviction"),
        ({"cpu_bytes": 1024, "load_timeout_seconds": 0}, "load_timeout_seconds"),
        ({"cpu_bytes": 1024, "offload_prompt_only": "no"}, "offload_prompt_only"),
        ({"cpu_bytes": 1024, "max_inflight_io_bytes": -1}, "max_inflight_io_bytes"),
        ({"cpu_bytes": 1024, "load_mode": "eager"}, "load_mode"),
        ({"cpu_bytes": 1024, "cpu_prealloc": 1}, "cpu_prealloc"),
        ({"remote_url": "http://x:1"}, "remote_url"),
        ({"remote_url": "valkey://x:1", "remote_timeout_seconds": 0}, "remote_timeout_seconds"),
        ({"remote_url": "valkey://x:1", "remote_ttl_seconds": 1.5}, "remote_ttl_seconds"),
        ({"remote_url": "valkey://x:1", "remote_key_prefix": 3}, "remote_key_prefix"),
    ],
)
def test_bad_config_names_the_key(extra: dict[str, object], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        OffloadEngine(
            {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra},
            make_layout(),
        )


def test_sizes_accept_suffixes() -> None:
    engine = full_engine(cpu="2KiB", max_inflight_io_bytes="1MiB")
    assert engine.cpu.index.capacity == 2048
    assert engine.sched.config.max_inflight_io_bytes == 1 << 20


def test_unusable_disk_path_is_a_clear_start_up_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")
    with pytest.raises(ValueError, match="cannot use 'disk_path'"):
        OffloadEngine(offload_config(cpu=None, disk=not_a_dir / "kv"), make_layout())

"""Two processes on one disk directory, played by two engines in one process: B starts first,
A stores, and B's lookups find A's units by probing their files (``DiskTier.probe``), adopt
them in ``build_connector_meta`` and load A's bytes."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
import torch

from hybridkv.connectors.offloading.tiers.disk.probe import PROBE_RETRY_SECONDS
from tests.connectors.helpers import FakeRequest, make_layout, make_request, stored_files, table

from .helpers import DST, SRC, OffloadEngine, offload_config

UNIT = 2048  # "full" layout: one group of 2 layers, 1024-byte blocks, 2 blocks per unit


def hybrid_pair(tmp_path: Path, fingerprint: str = "fp-a") -> tuple[OffloadEngine, OffloadEngine]:
    """(A, B) on one directory, B created first (its start-up scan saw nothing)."""
    layout = make_layout("hybrid")
    b = OffloadEngine(offload_config(disk=tmp_path), layout, seed=2)
    a = OffloadEngine(offload_config(disk=tmp_path), layout, fingerprint=fingerprint, seed=1)
    return a, b


def store_hybrid(a: OffloadEngine) -> FakeRequest:
    req = make_request("a", 18)
    a.save_prompt(req, table(a.layout, SRC, {2: 0}), [8, 16, 18])
    return req


def lookup(engine: OffloadEngine, req: FakeRequest) -> tuple[int, bool] | None:
    return engine.scheduler.get_num_new_matched_tokens(FakeRequest("q", req.all_token_ids), 0)


def adopt(engine: OffloadEngine, req: FakeRequest) -> dict[str, float]:
    """A lookup that finds units on disk asks again; the next step adopts them (counters)."""
    assert lookup(engine, req) is None
    engine.scheduler.build_connector_meta([])
    return engine.counters()


def test_a_running_engine_loads_units_another_stored_after_it_started(tmp_path: Path) -> None:
    a, b = hybrid_pair(tmp_path)
    assert lookup(b, make_request("a", 18)) == (0, False)  # nothing yet
    b.disk.clock = lambda: 1e9  # later than the retry delay of that miss
    req = store_hybrid(a)
    want = a.blocks_bytes([1, 2, 3, 4, 8, 9]).clone(), a.state_bytes(0).clone()
    assert adopt(b, req)["adopted.disk"] == 2
    assert lookup(b, req) == (16, True)
    load = FakeRequest("l", req.all_token_ids)
    num, _, _ = b.load(load, table(b.layout, DST, {2: 3}))
    assert num == 16 and b.scheduler.get_hit_sources(load, 16) == {"disk": 16}
    assert not b.finish("l").invalid_block_ids
    assert torch.equal(b.blocks_bytes([11, 12, 13, 14, 16, 17]), want[0])
    assert torch.equal(b.state_bytes(3), want[1])
    assert b.counters()["hits.disk"] == 2
    assert len(stored_files(tmp_path)) == 6  # B stored nothing again, removed nothing
    a.assert_clean()
    b.assert_clean()


@pytest.mark.parametrize("how", ["missing", "truncated", "foreign"])
def test_incomplete_or_foreign_units_are_not_adopted_nor_touched(tmp_path: Path, how: str) -> None:
    a, b = hybrid_pair(tmp_path, fingerprint="fp-b" if how == "foreign" else "fp-a")
    req = store_hybrid(a)
    if how == "foreign":  # fp-b's files copied under fp-a's names: headers say fp-b
        shutil.copytree(tmp_path / "fp-b", tmp_path / "fp-a", dirs_exist_ok=True)
    else:  # the tail unit lost (or has half of) its state part
        victim = Path(b.disk.path(req.block_hashes[3], 2))
        if how == "missing":
            victim.unlink()
        else:
            victim.write_bytes(victim.read_bytes()[:-3])
    before = {p: p.read_bytes() for p in stored_files(tmp_path)}
    if how == "foreign":
        assert lookup(b, req) == (0, False)
        assert not b.disk.index.entries
    else:
        assert adopt(b, req)["adopted.disk"] == 1  # the head unit is complete
        assert lookup(b, req) == (8, True)
        assert set(b.disk.index.entries) == {req.block_hashes[1]}
    b.scheduler.build_connector_meta([])
    assert b.disk.drain(5.0)
    assert {p: p.read_bytes() for p in stored_files(tmp_path)} == before
    b.assert_clean()


def test_the_negative_cache_bounds_the_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    a, b = hybrid_pair(tmp_path)
    b.disk.fault = lambda op, path: reads.append(path) if op == "probe" else None
    now = [100.0]
    b.disk.clock = lambda: now[0]
    waiting = make_request("a", 18)
    for _ in range(20):  # a request waiting in the queue, looked up every step
        assert lookup(b, waiting) == (0, False)
    assert len(reads) == 1  # the first unit's first part, once
    store_hybrid(a)
    reads.clear()
    now[0] += PROBE_RETRY_SECONDS / 2
    assert lookup(b, waiting) == (0, False) and reads == []  # not probed again yet
    now[0] += PROBE_RETRY_SECONDS
    assert lookup(b, waiting) is None
    assert len(reads) == 6  # 2 units x 3 parts
    assert lookup(b, waiting) is None and len(reads) == 6  # found ones wait for adoption
    b.scheduler.build_connector_meta([])
    assert lookup(b, waiting) == (16, True) and len(reads) == 6
    assert lookup(b, make_request("o", 40, first_token=500)) == (0, False)
    assert len(reads) == 7  # one probe per lookup: the walk stops at the first absent unit
    b.assert_clean()


def full_engine(tmp_path: Path, disk_bytes: int, seed: int) -> OffloadEngine:
    config = offload_config(cpu=None, disk=tmp_path, disk_bytes=disk_bytes)
    return OffloadEngine(config, make_layout("full"), seed=seed)


def store_full(engine: OffloadEngine, req: FakeRequest, first_block: int) -> None:
    blocks = table(engine.layout, {0: list(range(first_block, first_block + 5))})
    engine.save_prompt(req, blocks, [req.num_tokens])


def test_adoption_evicts_and_units_being_deleted_are_not_adopted(tmp_path: Path) -> None:
    b = full_engine(tmp_path, 2 * UNIT, seed=2)  # room for two units
    a = full_engine(tmp_path, 8 * UNIT, seed=1)
    own, shared = make_request("x", 18, first_token=700), make_request("a", 18)
    store_full(b, own, first_block=20)
    store_full(a, shared, first_block=1)
    want = a.blocks_bytes([1, 2, 3, 4]).clone()
    held = threading.Event()
    b.disk.fault = lambda op, path: held.wait() if op == "delete" else None  # queued
    try:
        counters = adopt(b, shared)
        assert counters["adopted.disk"] == 2 and counters["evictions.disk"] == 2
        assert Path(b.disk.path(own.block_hashes[1], 0)).exists()  # not deleted yet...
        assert lookup(b, own) == (0, False)  # ...but never adopted back
    finally:
        held.set()
    assert b.disk.drain(5.0)
    assert not Path(b.disk.path(own.block_hashes[1], 0)).exists()
    b.load(FakeRequest("l", shared.all_token_ids), table(b.layout, {0: [40, 41, 42, 43, 44]}))
    assert not b.finish("l").invalid_block_ids
    assert torch.equal(b.blocks_bytes([40, 41, 42, 43]), want)
    b.assert_clean()

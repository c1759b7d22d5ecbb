"""CPU-tier memory reuse: an evicted unit's buffers hold the next units, loads from reused
memory return the right bytes, free buffers stay within the capacity, and a unit whose disk
write-behind has not run yet is never evicted (its buffers would be overwritten)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from hybridkv.connectors.offloading.tier import UnitState
from hybridkv.connectors.offloading.tiers.cpu import entry as cpu_entry
from hybridkv.native import PageCopy
from tests.connectors.helpers import FakeRequest, make_layout, make_request, table
from tests.support.waits import wait_for

from .helpers import OffloadEngine, offload_config

UNIT = 2048  # "full" layout: one group of 2 layers, 1024-byte blocks, 2 blocks per unit


@pytest.fixture(autouse=True)
def with_native(native: PageCopy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_entry, "load_pagecopy", lambda: native)  # reuse needs the kernels


def full_engine(**kw: object) -> OffloadEngine:
    return OffloadEngine(offload_config(**kw), make_layout("full"), seed=5)  # type: ignore[arg-type]


def save(engine: OffloadEngine, req: FakeRequest, first_block: int, wait: bool = True) -> None:
    n = -(-req.num_tokens // 4)
    blocks = table(engine.layout, {0: list(range(first_block, first_block + n))})
    engine.worker.save(engine.scheduler.build_connector_meta([(req, 0, req.num_tokens, blocks)]))
    if wait:
        assert engine.offload_worker.wait_for_saves(5.0)


def part_addresses(engine: OffloadEngine) -> set[int]:
    return {
        part.data.data_ptr()
        for entry in engine.cpu.index.entries.values()
        for part in entry.parts.values()
    }


def room_is_kept(engine: OffloadEngine) -> None:
    index = engine.cpu.index
    held = index.used - index.num_pending_bytes
    assert index.buffers.num_free_bytes + held <= index.capacity


def test_evicted_memory_holds_the_next_units_and_loads_right_bytes() -> None:
    engine = full_engine(cpu=3 * UNIT)
    a, b = make_request("a", 18, first_token=1), make_request("b", 26, first_token=500)
    save(engine, a, first_block=1)  # units ending at 8 and 16
    first = part_addresses(engine)
    save(engine, b, first_block=10)  # 3 units: evicts both of A's, reuses their memory
    assert len(part_addresses(engine) & first) == 2
    room_is_kept(engine)
    expected = engine.blocks_bytes(list(range(10, 16))).clone()
    engine.load(FakeRequest("l", b.all_token_ids), table(engine.layout, {0: list(range(40, 47))}))
    out = engine.finish("l")
    assert not out.invalid_block_ids and not out.failed_recving
    assert torch.equal(engine.blocks_bytes(list(range(40, 46))), expected)
    engine.assert_clean()


def test_free_buffers_stay_within_the_capacity_through_churn() -> None:
    engine = full_engine(cpu=4 * UNIT)
    for i in range(8):  # prompts of 2-4 units, each evicting earlier ones
        save(engine, make_request(f"r{i}", 10 + 6 * (i % 3), first_token=100 * i + 1), 1 + 5 * i)
        room_is_kept(engine)
    assert engine.cpu.index.used <= 4 * UNIT
    engine.assert_clean()


def test_a_unit_waiting_for_its_disk_write_is_not_evicted(tmp_path: Path) -> None:
    engine = full_engine(cpu=2 * UNIT, disk=tmp_path)
    release = threading.Event()
    engine.disk.fault = lambda op, path: release.wait() if op == "write" else None
    a, b = make_request("a", 18, first_token=1), make_request("b", 18, first_token=500)
    a_bytes = engine.blocks_bytes([1, 2, 3, 4]).clone()
    save(engine, a, first_block=1, wait=False)
    wait_for(
        lambda: engine.cpu.index.state_of(a.block_hashes[3]) is UnitState.READY,
        what="A's last unit to be ready in the CPU tier",
    )
    save(engine, b, first_block=10, wait=False)  # no room but A's units: pinned, kept
    assert engine.cpu.index.state_of(a.block_hashes[1]) is UnitState.READY
    release.set()
    assert engine.offload_worker.wait_for_saves(5.0)
    for k, unit_hash in ((0, a.block_hashes[1]), (2, a.block_hashes[3])):
        on_disk = engine.disk.read(unit_hash, 4 * (k + 2), 0).view(2, 2, -1)
        assert torch.equal(on_disk, a_bytes[k : k + 2])  # the bytes A stored, not B's
    assert engine.cpu.index.num_pinned() == 0
    engine.assert_clean()


def test_preallocated_memory_holds_the_first_units(tmp_path: Path) -> None:
    engine = full_engine(cpu=3 * UNIT + 100, cpu_prealloc=True)
    buffers = engine.cpu.index.buffers
    assert buffers.num_free_bytes == 3 * UNIT  # three sets of the unit's one part, mapped
    free = {b.data_ptr() for bs in buffers._free.values() for b in bs}
    a = make_request("a", 18)
    save(engine, a, first_block=1)
    assert part_addresses(engine) <= free and buffers.num_free_bytes == UNIT
    room_is_kept(engine)
    want = engine.blocks_bytes([1, 2, 3, 4]).clone()
    engine.load(FakeRequest("l", a.all_token_ids), table(engine.layout, {0: list(range(40, 45))}))
    assert not engine.finish("l").invalid_block_ids
    assert torch.equal(engine.blocks_bytes([40, 41, 42, 43]), want)
    engine.assert_clean()

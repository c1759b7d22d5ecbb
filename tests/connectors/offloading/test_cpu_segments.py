"""CPU-tier loads copy and verify segment by segment: a bad byte in any segment fails its part,
a partly loaded segment is still verified whole, and a timeout stops the copies. Every test
runs with the native copy kernels and without them (numpy copies + xxh3)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from hybridkv.connectors.offloading import loads
from hybridkv.connectors.offloading.loads import CpuSegment, InflightLoad, PartWriter
from hybridkv.connectors.offloading.tiers.cpu import entry as cpu_entry
from hybridkv.connectors.offloading.tiers.cpu import tier as cpu_tier
from hybridkv.native import PageCopy
from tests.connectors.helpers import FakeRequest, make_layout, make_request, table

from .helpers import DST, SRC, OffloadEngine, offload_config

# "full" layout: one group of 2 layers, 1024-byte block rows. Units of 6 blocks (24 tokens),
# checksummed in segments of 2 rows: every part has 3 segments (rows 0-1, 2-3, 4-5).
CHUNK = 24
ROW = 1024
SEGMENT = 2 * ROW
LOAD_IDS = list(range(40, 53))  # a 50-token prompt: 13 blocks, units end at 24 and 48


@pytest.fixture(autouse=True, params=["native", "numpy"])
def kernel(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, native: PageCopy
) -> PageCopy | None:
    monkeypatch.setattr(cpu_tier, "SEGMENT_BYTES", SEGMENT)
    chosen = native if request.param == "native" else None
    monkeypatch.setattr(cpu_entry, "load_pagecopy", lambda: chosen)
    return chosen


def stored_full(**extra: object) -> tuple[OffloadEngine, FakeRequest]:
    config = offload_config(chunk_tokens=CHUNK, **extra)  # type: ignore[arg-type]
    engine = OffloadEngine(config, make_layout("full"), seed=3)
    assert engine.cache.page_table() is not None
    req = make_request("a", 50)
    engine.save_prompt(req, table(engine.layout, {0: list(range(1, 14))}), [50])
    return engine, req


def flip(engine: OffloadEngine, unit_hash: object, group_id: int, offset: int) -> None:
    part = engine.cpu.index.entries[unit_hash].parts[group_id]  # type: ignore[index]
    part.data.view(-1)[offset] ^= 0x10


@pytest.mark.parametrize("offset", [0, SEGMENT + ROW // 2, 3 * SEGMENT - 1])
def test_a_flipped_byte_in_any_segment_fails_its_part(offset: int) -> None:
    engine, a = stored_full()
    stored = engine.cpu.index.entries[a.block_hashes[11]].parts[0]
    assert len(stored.checksums) == 3 and stored.rows_per_segment == 2
    before = engine.blocks_bytes(list(range(1, 7))).clone()
    flip(engine, a.block_hashes[11], 0, offset)  # the second unit's part: blocks 7..12
    engine.load(FakeRequest("l", a.all_token_ids), table(engine.layout, {0: LOAD_IDS}))
    out = engine.finish("l")
    assert out.invalid_block_ids == dict.fromkeys(LOAD_IDS[6:12], "corrupt")
    assert not out.failed_recving and "l" in out.finished_recving
    assert torch.equal(engine.blocks_bytes(LOAD_IDS[:6]), before)  # the good unit loaded
    counters = engine.counters()
    assert counters["load_failures:corrupt"] == 1 and counters["removed.cpu"] == 1
    assert a.block_hashes[11] not in engine.cpu.index.entries  # the bad unit left the tier
    engine.assert_clean()  # no pin, no reservation, no load left behind


def test_a_partly_loaded_segment_is_verified_whole() -> None:
    engine, a = stored_full()
    flip(engine, a.block_hashes[5], 0, ROW + 7)  # row 1: in segment 0 with row 0 (local)
    req = FakeRequest("l", a.all_token_ids)
    ids = [0] + LOAD_IDS[1:]
    num, _, _ = engine.load(req, table(engine.layout, {0: ids}), local=4)
    assert num == 44
    out = engine.finish("l")
    assert out.invalid_block_ids == dict.fromkeys(LOAD_IDS[1:6], "corrupt")
    engine.assert_clean()


@pytest.mark.parametrize("offset", [0, 100, 199])
def test_a_flipped_byte_in_any_state_segment_is_invalid_state(
    offset: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu_tier, "SEGMENT_BYTES", 64)
    layout = make_layout("hybrid")
    engine = OffloadEngine(offload_config(), layout, seed=1)
    a = make_request("a", 18)
    engine.save_prompt(a, table(layout, SRC, {2: 0}), [8, 16, 18])
    stored = engine.cpu.index.entries[a.block_hashes[3]].parts[2]
    assert stored.data.numel() == 200 and len(stored.checksums) == 4
    flip(engine, a.block_hashes[3], 2, offset)
    engine.load(FakeRequest("l", a.all_token_ids), table(layout, DST, {2: 3}))
    out = engine.finish("l")
    assert out.invalid_state == {"l": "corrupt"} and not out.invalid_block_ids
    assert engine.counters()["load_failures:corrupt"] == 1
    engine.assert_clean()


@pytest.mark.slow  # waits out a load's timeout (2.5 s)
def test_a_timed_out_load_writes_nothing_after_its_timeout_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A write takes 0.3 s and the timeout is 0.5 s: the first write ends well before it, the
    # second is waiting when it fires (margins wide enough for a loaded machine).
    engine, a = stored_full(load_timeout_seconds=0.5)
    writes: list[tuple[float, float, int]] = []  # (start, end, segments) of every write
    lock = threading.Lock()
    real_write = PartWriter._write_batch

    def slow_write(self: PartWriter, load: InflightLoad, batch: list[CpuSegment]) -> object:
        began = time.monotonic()
        time.sleep(0.3)
        verified = real_write(self, load, batch)
        if verified is not None:
            with lock:
                writes.append((began, time.monotonic(), len(batch)))
        return verified

    monkeypatch.setattr(PartWriter, "_write_batch", slow_write)
    monkeypatch.setattr(loads, "BATCH_BYTES", 2 * SEGMENT)
    before = engine.blocks_bytes(LOAD_IDS[:12]).clone()
    engine.load(FakeRequest("l", a.all_token_ids), table(engine.layout, {0: LOAD_IDS}))
    out = engine.finish("l", timeout=5.0)
    reported = time.monotonic()
    assert out.failed_recving == {"l": "timeout"}
    time.sleep(2.0)  # 6 segments, ~0.3 s each: any copy not stopped would have run by now
    with lock:
        assert writes and all(end <= reported for _, end, _ in writes)
        num_written = sum(n for _, _, n in writes)
    assert num_written < 6
    after = engine.blocks_bytes(LOAD_IDS[:12])
    changed = [not torch.equal(after[i], before[i]) for i in range(12)]
    assert sum(changed) == 2 * num_written  # exactly the segments written before the timeout
    counters = engine.counters()
    assert counters["timeouts"] == 1 and "load_failures:corrupt" not in counters
    engine.assert_clean()

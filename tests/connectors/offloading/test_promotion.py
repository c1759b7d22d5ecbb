"""Disk hits are copied back into the CPU tier a step after their load: the next load of the
same prefix reads the CPU tier, with the same bytes. A bad file aborts the copy (nothing
becomes visible), and a CPU tier without room skips it; nothing stays pinned or reserved."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridkv.kv.checkpoints import CheckpointKind
from tests.connectors.helpers import FakeRequest, make_layout, make_request, table

from .helpers import OffloadEngine, offload_config

UNIT = 2048  # "full" layout: one group of 2 layers, 1024-byte blocks, 2 blocks per unit


def engine_with(tmp_path: Path, cpu: int) -> OffloadEngine:
    return OffloadEngine(offload_config(cpu=cpu, disk=tmp_path), make_layout("full"), seed=9)


def store(engine: OffloadEngine, req: FakeRequest, first_block: int) -> None:
    n = -(-req.num_tokens // 4)
    engine.save_prompt(
        req, table(engine.layout, {0: list(range(first_block, first_block + n))}), [req.num_tokens]
    )


def load(engine: OffloadEngine, req: FakeRequest, rid: str) -> dict[str, int]:
    """Load ``req``'s prefix into blocks 40..; the tokens per tier it came from."""
    probe = FakeRequest(rid, req.all_token_ids)
    num, _, _ = engine.load(probe, table(engine.layout, {0: list(range(40, 45))}))
    out = engine.finish(rid)
    assert not out.invalid_block_ids and not out.failed_recving
    return engine.scheduler.get_hit_sources(probe, num)


def next_step(engine: OffloadEngine) -> None:
    """A step with nothing to compute: its metadata carries the promotions; wait for them."""
    engine.worker.save(engine.scheduler.build_connector_meta([]))
    assert engine.offload_worker.wait_for_saves(5.0)


def evicted_from_cpu(tmp_path: Path) -> tuple[OffloadEngine, FakeRequest, torch.Tensor]:
    engine = engine_with(tmp_path, cpu=2 * UNIT)
    a, b = make_request("a", 18, first_token=1), make_request("b", 18, first_token=500)
    store(engine, a, first_block=1)
    store(engine, b, first_block=10)  # evicts A's two units from the CPU tier
    assert engine.cpu.index.state_of(a.block_hashes[1]) is None
    return engine, a, engine.blocks_bytes([1, 2, 3, 4]).clone()


def test_a_disk_hit_is_promoted_and_the_next_load_reads_the_cpu_tier(tmp_path: Path) -> None:
    engine, a, want = evicted_from_cpu(tmp_path)
    assert load(engine, a, "l1") == {"disk": 16}
    next_step(engine)
    counters = engine.counters()
    assert counters["promotions.cpu"] == 2 and counters["evictions.cpu"] >= 2
    kinds = [engine.cpu.index.policy.kind_of(a.block_hashes[k]) for k in (1, 3)]
    assert kinds == [CheckpointKind.PERIODIC, CheckpointKind.PROMPT]  # carried from the disk
    engine.blocks_bytes([40, 41, 42, 43]).zero_()
    assert load(engine, a, "l2") == {"cpu": 16}
    assert torch.equal(engine.blocks_bytes([40, 41, 42, 43]), want)
    next_step(engine)  # a CPU hit promotes nothing
    assert "promotions.cpu" not in engine.counters()
    engine.assert_clean()


def test_a_bad_file_aborts_the_promotion(tmp_path: Path) -> None:
    engine, a, _ = evicted_from_cpu(tmp_path)
    assert load(engine, a, "l1") == {"disk": 16}
    victim = Path(engine.disk.path(a.block_hashes[3], 0))
    victim.write_bytes(victim.read_bytes()[:-100])  # truncated after the load read it
    next_step(engine)
    counters = engine.counters()
    assert counters["promotions.cpu"] == 1 and counters["promotion_failures:truncated"] == 1
    assert engine.cpu.index.state_of(a.block_hashes[3]) is None  # never visible
    engine.assert_clean()


def test_no_room_in_the_cpu_tier_skips_the_promotion(tmp_path: Path) -> None:
    engine, a, _ = evicted_from_cpu(tmp_path)
    b = make_request("b", 18, first_token=500)
    assert load(engine, a, "l1") == {"disk": 16}
    serials = [engine.cpu.index.pin(u) for u in (b.block_hashes[1], b.block_hashes[3])]
    assert all(serials)  # in use by some load: cannot be evicted
    next_step(engine)
    assert engine.counters()["promotions_skipped:no_room"] == 2
    assert engine.cpu.index.state_of(a.block_hashes[1]) is None
    for unit, serial in zip((b.block_hashes[1], b.block_hashes[3]), serials, strict=True):
        engine.cpu.index.unpin(unit, serial)
    engine.assert_clean()  # the disk pins the promotions took are released too

"""Issue 18's probes of the disk tier, each reproduced on real files: a FIFO or symlink at a
unit's path, a huge body behind a valid header, a stuck read, a failed store, a late unpin,
forged / foreign / old-format units, dead processes' temporary files, a smaller budget."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Hashable, Iterator
from pathlib import Path

import pytest

from hybridkv.connectors.offloading.tiers.cpu.tier import CpuTier
from hybridkv.connectors.offloading.tiers.disk import format as disk_format
from hybridkv.connectors.offloading.tiers.disk.format import PartError
from hybridkv.connectors.offloading.tiers.disk.key import KEY_FILE, DirectoryKey
from tests.connectors.helpers import FakeRequest, make_layout, make_request, stored_files, table
from tests.support.waits import wait_for

from .helpers import OffloadEngine, offload_config

UNIT = 2048  # "full" layout: one group of 2 layers, 1024-byte blocks, 2 blocks per unit


def engine(tmp_path: Path, cpu: int | None = None, **extra: object) -> OffloadEngine:
    config = offload_config(cpu=cpu, disk=tmp_path, **extra)  # type: ignore[arg-type]
    return OffloadEngine(config, make_layout("full"))


def store(e: OffloadEngine, req: FakeRequest, first_block: int = 1) -> None:
    n = -(-req.num_tokens // 4)
    e.save_prompt(req, table(e.layout, {0: list(range(first_block, first_block + n))}), [16])


def lookup(e: OffloadEngine, req: FakeRequest) -> tuple[int, bool] | None:
    return e.scheduler.get_num_new_matched_tokens(FakeRequest("q", req.all_token_ids), 0)


def load(e: OffloadEngine, req: FakeRequest, rid: str = "l") -> dict[int, str]:
    e.load(FakeRequest(rid, req.all_token_ids), table(e.layout, {0: [40, 41, 42, 43, 44]}))
    return dict(e.finish(rid).invalid_block_ids)


def replace_with_fifo(path: str) -> None:
    os.unlink(path)
    os.mkfifo(path)


@pytest.mark.timeout(30)
def test_a_fifo_at_a_units_path_never_blocks(tmp_path: Path) -> None:
    """Finding 1: lookups, probes, loads and the start-up scan meet FIFOs without opening
    them for a blocking read."""
    a = make_request("a", 18)
    writer = engine(tmp_path)
    store(writer, a)
    head, tail = (writer.disk.path(a.block_hashes[k], 0) for k in (1, 3))
    replace_with_fifo(tail)  # an indexed unit's file: the load fails, unsafe
    began = time.monotonic()
    assert lookup(writer, a) == (16, True)
    assert load(writer, a) == {42: "unsafe", 43: "unsafe"}
    assert writer.counters()["load_failures:unsafe"] == 1
    replace_with_fifo(head)
    other = engine(tmp_path)  # start-up scan and probes: FIFOs are never opened
    assert lookup(other, a) == (0, False)
    assert time.monotonic() - began < 5.0
    assert stat.S_ISFIFO(os.stat(head, follow_symlinks=False).st_mode)  # left alone
    other.assert_clean()


def test_a_symlink_at_a_units_path_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"precious")
    a = make_request("a", 18)
    e = engine(tmp_path / "kv")
    store(e, a)
    head = e.disk.path(a.block_hashes[1], 0)
    os.unlink(head)
    os.symlink(outside, head)
    assert load(e, a) == {40: "unsafe", 41: "unsafe"}
    assert engine(tmp_path / "kv").disk.index.get(a.block_hashes[1]) is None
    assert outside.read_bytes() == b"precious" and os.path.islink(head)


def test_a_huge_body_behind_a_valid_header_is_refused_before_reading(tmp_path: Path) -> None:
    """Finding 8: the size is checked against the part's expected size before allocating."""
    a = make_request("a", 18)
    e = engine(tmp_path)
    store(e, a)
    head = e.disk.path(a.block_hashes[1], 0)
    with open(head, "r+b") as f:
        f.truncate(5 << 30)  # sparse: 5 GiB that cost nothing on disk
    began = time.monotonic()
    assert load(e, a) == {40: "corrupt", 41: "corrupt"}
    assert time.monotonic() - began < 2.0
    assert e.disk.drain(5.0)
    assert not os.path.exists(head)  # a file of ours that is broken is removed


@pytest.mark.slow  # waits out a stuck read or write (seconds)
@pytest.mark.timeout(30)
def test_a_stuck_read_quarantines_its_unit_and_the_tier_keeps_working(tmp_path: Path) -> None:
    """Finding 4: a read that never returns costs its load a timeout; write-through, other
    loads and CPU pins carry on, and shutdown is quick."""
    e = engine(tmp_path, cpu=8 * UNIT, load_timeout_seconds=0.5)
    a, b = make_request("a", 18), make_request("b", 18, first_token=500)
    store(e, a)
    stuck = threading.Event()
    head = e.disk.path(a.block_hashes[1], 0)
    e.disk.fault = lambda op, path: stuck.wait() if path == head else None
    e.cpu.index.clear()  # served by the disk
    e.load(FakeRequest("l", a.all_token_ids), table(e.layout, {0: [40, 41, 42, 43, 44]}))
    out = e.finish("l", timeout=5.0)  # the load's timeout or the watchdog's, first
    assert out.failed_recving == {"l": "timeout"} or {40, 41} <= set(out.invalid_block_ids)
    wait_for(lambda: a.block_hashes[1] in e.disk.quarantined, 5.0, what="the quarantine")
    assert e.counters()["quarantined.disk"] == 1
    store(e, b, first_block=10)  # write-through still works: 4 workers, one stuck
    assert e.disk.index.get(b.block_hashes[3]) is not None
    assert e.cpu.index.num_pinned() == 0
    e.cpu.index.clear()
    assert load(e, b, "l2") == {}  # other disk loads are served
    counters = e.counters()
    assert counters["stores.disk"] == 2 and counters["hits.disk"] == 2
    began = time.monotonic()
    e.worker.shutdown()
    assert time.monotonic() - began < 4.0  # the read is still stuck
    stuck.set()


def test_an_exception_on_the_store_thread_fails_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding 3: the unit is never left PENDING (lookups would answer "later" forever)."""
    e = engine(tmp_path, cpu=8 * UNIT)
    a = make_request("a", 18)

    def broken(*args: object, **kw: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(CpuTier, "store", broken)
    store(e, a)
    monkeypatch.undo()
    assert lookup(e, a) == (0, False)
    counters = e.counters()
    assert counters["store_failures.cpu"] == 2 and counters["store_failures.disk"] == 2
    e.assert_clean()
    store(e, a)  # stored again later
    assert lookup(e, a) == (16, True)


def test_a_failed_disk_write_is_logged_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    e = engine(tmp_path, cpu=8 * UNIT)

    def full(op: str, path: str) -> None:
        if op == "write":
            raise OSError(28, "No space left on device")

    e.disk.fault = full
    store(e, make_request("a", 18))
    counters = e.counters()
    assert counters["store_failures.disk"] == 2 and counters["stores.cpu"] == 2
    assert sum("No space left" in r.getMessage() for r in caplog.records) == 1  # rate-limited
    e.assert_clean()


def test_a_late_unpin_never_releases_a_newer_entrys_pin(tmp_path: Path) -> None:
    """Finding 18: pins name the entry they pinned."""
    e = engine(tmp_path, cpu=8 * UNIT)
    a = make_request("a", 18)
    store(e, a)
    unit = a.block_hashes[1]
    old = e.cpu.index.pin(unit)
    e.cpu.index.remove(unit)  # found bad by a load: dropped despite the pin
    e.disk.index.remove(unit)
    store(e, a)
    new = e.cpu.index.pin(unit)
    assert old is not None and new is not None and old != new
    e.cpu.index.unpin(unit, old)  # the first load's late unpin
    entry = e.cpu.index.get(unit)
    assert entry is not None and entry.pins == 1
    e.cpu.index.unpin(unit, new)
    e.assert_clean()


@pytest.mark.parametrize("how", ["forged", "foreign", "old_format"])
def test_forged_foreign_and_old_units_are_counted_misses(tmp_path: Path, how: str) -> None:
    """Finding 5: only parts this directory's key authenticated are ever used."""
    a = make_request("a", 18)
    e = engine(tmp_path)
    store(e, a)
    head = e.disk.path(a.block_hashes[1], 0)
    key = f"{a.block_hashes[1].hex()}.g0"
    span, zeros = (0, 8), memoryview(bytes(UNIT))
    if how == "old_format":  # FileConnector's format version 2, plain checksum
        from hybridkv.connectors.file.format import write_part

        write_part(head, "fp-a", key, span, zeros, checksum="xxh3")
    else:
        signer = DirectoryKey(b"x" * 32) if how == "foreign" else e.disk.key
        header = bytearray(disk_format.encode_header(signer, "fp-a", key, span, zeros))
        if how == "forged":
            header[-1] ^= 1  # no key: the MAC cannot be right
        Path(head).write_bytes(bytes(header) + bytes(zeros))
    reason = {"forged": "forged", "foreign": "foreign", "old_format": "mismatch"}[how]
    assert load(e, a) == {40: reason, 41: reason}
    assert e.counters()[f"load_failures:{reason}"] == 1
    other = engine(tmp_path)  # start-up: refused, never adopted
    assert other.disk.index.get(a.block_hashes[1]) is None
    with pytest.raises(PartError):
        e.disk.check_part(head, key)


def test_directories_are_private_and_names_reveal_no_token_hash(tmp_path: Path) -> None:
    a = make_request("a", 18)
    e = engine(tmp_path / "kv")
    store(e, a)
    key_file = tmp_path / "kv" / KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    for d in (
        tmp_path / "kv",
        Path(e.disk.directory),
        Path(e.disk.path(a.block_hashes[1], 0)).parent,
    ):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    names = " ".join(p.name for p in stored_files(tmp_path / "kv"))
    assert a.block_hashes[1].hex()[:16] not in names and a.block_hashes[3].hex()[:16] not in names
    key_file.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        engine(tmp_path / "kv")


def test_temporary_files_of_dead_processes_are_removed_at_start_up(tmp_path: Path) -> None:
    """Finding 17: ``kill -9`` debris does not survive a restart."""
    e = engine(tmp_path)
    store(e, make_request("a", 18))
    sub = Path(e.disk.path(make_request("a", 18).block_hashes[1], 0)).parent
    host = disk_format.tmp_owner().partition("-")[0]
    dead = sub / f".x.kvu.{host}-{2**22 + 12345}.ab12.tmp"
    live = sub / f".y.kvu.{disk_format.tmp_owner()}.cd34.tmp"
    dead.write_bytes(b"half")
    live.write_bytes(b"half")
    restarted = engine(tmp_path)
    assert not dead.exists() and live.exists()
    assert restarted.counters()["startup.disk.tmp_removed"] == 1


def test_a_smaller_budget_never_deletes_a_shared_directory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 15: a second process with a tiny ``disk_bytes`` indexes what fits, deletes
    nothing at start-up, and says so."""
    big = engine(tmp_path, disk_bytes=64 * UNIT)
    for k in range(6):
        store(big, make_request(f"r{k}", 18, first_token=1 + 100 * k))
    before = stored_files(tmp_path)
    assert len(before) == 12
    small = engine(tmp_path, disk_bytes=2 * UNIT)
    assert stored_files(tmp_path) == before
    assert len(small.disk.index.entries) == 2
    assert any("created with disk_bytes" in r.getMessage() for r in caplog.records)
    assert small.counters()["startup.disk.left_over_budget"] == 10


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_eviction_cost_does_not_grow_with_the_tier(policy: str) -> None:
    """Finding 14: a store into a full tier of 20k units (chains of 8, tails older than
    heads, as lookups touch them) looks at a few candidates per eviction, not a scan: the
    policy's candidate walk is counted (a scan looks at thousands)."""
    from hybridkv.connectors.offloading.policies import create_policy
    from hybridkv.connectors.offloading.tier import TierIndex
    from hybridkv.kv.hashing import BlockHash

    n = 20_000
    index = TierIndex("disk", n, create_policy(policy, n))

    def unit(k: int) -> BlockHash:
        return BlockHash(k.to_bytes(8, "little"))

    for chain in range(n // 8):
        for depth in reversed(range(8)):  # tails first: heads are the most recent
            k = chain * 8 + depth
            parent = unit(k - 1) if depth else None
            assert index.reserve(unit(k), 8 * (depth + 1), 1, parent) == []
            index.commit(unit(k), {})
    looked = 0
    walk = index.policy.iter_candidates

    def counted() -> Iterator[Hashable]:
        nonlocal looked
        for key in walk():
            looked += 1
            yield key

    index.policy.iter_candidates = counted  # type: ignore[method-assign]
    for k in range(n, n + 2000):
        evicted = index.reserve(unit(k), 8, 1, None)
        assert evicted is not None and len(evicted) == 1
        index.commit(unit(k), {})
    assert looked / 2000 <= 16, f"{looked / 2000:.1f} candidates looked at per store"
    index.check_accounting()


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"cpu_bytes": "1MiB", "load_timeout_seconds": float("nan")}, "load_timeout_seconds"),
        ({"cpu_bytes": "1MiB", "load_timeout_seconds": float("inf")}, "load_timeout_seconds"),
        ({"cpu_bytes": 1}, "cpu_bytes"),
        ({"disk_path": "/nonexistent/x", "disk_bytes": 100}, "disk_bytes"),
        ({"cpu_bytes": "100000GiB", "cpu_prealloc": True}, "cpu_bytes"),
        ({"cpu_bytes": "1MiB", "chunk_tokens": 64}, "chunk_tokens"),
    ],
)
def test_numeric_options_are_checked_at_start_up(extra: dict[str, object], key: str) -> None:
    """Finding 16: each is a clear error naming the option (max_model_len is 32 here)."""
    from hybridkv.connectors.registry import (
        ConnectorContext,
        create_connector,
        parse_kv_transfer_config,
    )

    config = {
        "kv_connector": "OffloadingConnector",
        "kv_connector_extra_config": {"chunk_tokens": 8, **extra},
    }
    context = ConnectorContext(make_layout("full"), "fp", 64, 4, max_model_len=32)
    with pytest.raises(ValueError, match=key):
        create_connector(parse_kv_transfer_config(config, 4), context)


@pytest.mark.slow  # waits out a stuck read or write (seconds)
@pytest.mark.timeout(60)
def test_shutdown_is_quick_while_a_write_is_stuck(tmp_path: Path) -> None:
    """Finding 4 (SIGTERM took 35 s): the engine's shutdown (wait for saves, then stop) ends
    within seconds although a disk write never returns, and releases the CPU pins."""
    e = engine(tmp_path, cpu=8 * UNIT, load_timeout_seconds=60)  # the watchdog stays quiet
    stuck = threading.Event()
    e.disk.fault = lambda op, path: stuck.wait() if op == "write" else None
    a = make_request("a", 18)
    blocks = table(e.layout, {0: [1, 2, 3, 4, 5]})
    e.worker.save(e.scheduler.build_connector_meta([(a, 0, 16, blocks)]))
    began = time.monotonic()
    assert not e.offload_worker.wait_for_saves(30.0)  # as ``EngineCore.shutdown`` waits
    e.worker.shutdown()
    assert time.monotonic() - began < 10.0
    assert e.cpu.index.num_pinned() == 0 and e.disk.index.num_pending() == 0
    stuck.set()


@pytest.mark.timeout(30)
def test_a_stuck_probe_answers_later_then_absent(tmp_path: Path) -> None:
    """A lookup whose probe hangs never blocks the scheduler: "ask again" until the watchdog
    gives up on the probe, then a miss (the request is computed, not kept waiting)."""
    e = engine(tmp_path, load_timeout_seconds=0.5)
    e.disk.probe_wait = 0.01
    stuck = threading.Event()
    e.disk.fault = lambda op, path: stuck.wait() if op == "probe" else None
    a = make_request("a", 18)
    # "ask again" (None), not the miss the watchdog's give-up (after 0.5 s) would be: the
    # lookup returned while the probe was stuck
    assert lookup(e, a) is None
    wait_for(lambda: lookup(e, a) is not None, timeout=5.0, what="the watchdog to give up")
    assert lookup(e, a) == (0, False)
    stuck.set()

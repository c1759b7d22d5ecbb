"""FileConnector against a hostile or stuck directory (issue 18): a FIFO, a symlink or a huge
file at a part's path is refused at once (never waited on, never followed, never read whole);
a load stuck in a read times out and, when the read returns, writes nothing."""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridkv.connectors.file import worker as file_worker
from hybridkv.connectors.file.format import write_part
from hybridkv.connectors.file.store import block_key
from tests.support.stats import flat_counters
from tests.support.waits import wait_for

from .helpers import Engine, file_config, make_layout, make_request, table
from .test_file_connector import DST_TABLES, saved_engine


def load_with_victim(tmp_path: Path, mode: str, plant: Any) -> tuple[Engine, Engine, Any]:
    """Save a prompt, let ``plant(victim_path)`` replace block 2's file after start-up (the
    index still lists it), and load it into a new engine."""
    src, req = saved_engine(tmp_path)
    dst = Engine(file_config(tmp_path, load_mode=mode), src.layout, seed=2)
    victim = tmp_path / "fp-a" / block_key(0, req.block_hashes[2])
    victim.unlink()
    plant(victim)
    dst.load(make_request("b", 18), table(src.layout, DST_TABLES, {2: 3}))
    out = dst.finish("b") if mode == "async" else dst.worker.get_finished([])
    return src, dst, out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_fifo_at_a_part_path_is_refused_not_waited_on(tmp_path: Path, mode: str) -> None:
    start = time.monotonic()
    src, dst, out = load_with_victim(tmp_path, mode, os.mkfifo)
    assert time.monotonic() - start < 5  # once: every lookup hung on the engine thread
    assert out.invalid_block_ids == {13: "corrupt"} and not out.failed_recving
    assert torch.equal(dst.blocks_bytes([11, 12, 14]), src.blocks_bytes([1, 2, 4]))
    dst.worker.shutdown()


def test_a_symlink_is_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.kv"
    outside.write_bytes(b"precious")

    def plant(victim: Path) -> None:
        victim.symlink_to(outside)

    _, dst, out = load_with_victim(tmp_path, "sync", plant)
    assert out.invalid_block_ids == {13: "corrupt"}
    assert outside.read_bytes() == b"precious"  # the link went, its target did not
    dst.worker.shutdown()


def test_symlinks_and_fifos_in_the_directory_are_not_indexed(tmp_path: Path) -> None:
    src, req = saved_engine(tmp_path)
    root = tmp_path / "fp-a"
    outside = tmp_path / "elsewhere"
    os.rename(root / "g0", outside)
    (root / "g0").symlink_to(outside)  # a symlinked group directory
    os.mkfifo(root / "g1" / ("ab" * 16 + ".kv"))
    dst = Engine(file_config(tmp_path, load_mode="sync"), src.layout, seed=2)
    assert dst.scheduler.get_num_new_matched_tokens(make_request("b", 18), 0) == (0, False)
    with pytest.raises(NotADirectoryError):
        dst.worker.store.prepare_dir(block_key(0, req.block_hashes[0]))  # no writes through it
    dst.worker.shutdown()


def test_a_huge_file_with_a_valid_header_is_never_read_whole(tmp_path: Path) -> None:
    def plant(victim: Path) -> None:  # the right header, then 64 MiB instead of one page
        write_part(str(victim), "fp-a", victim.parent.name + "/" + victim.name, (8, 12), b"")
        with victim.open("ab") as f:
            f.truncate(64 << 20)

    tracemalloc.start()
    try:
        _, dst, out = load_with_victim(tmp_path, "sync", plant)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.invalid_block_ids == {13: "mismatch"}
    assert peak < 8 << 20, peak  # once: the whole body, 4.6 GB in the probe
    dst.worker.shutdown()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_stuck_read_times_out_and_its_late_bytes_are_dropped(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, _ = saved_engine(tmp_path)
    release = threading.Event()
    real = file_worker.read_part

    def stuck(path: str, *args: Any) -> Any:
        release.wait(30)  # a disk that does not answer
        return real(path, *args)

    monkeypatch.setattr(file_worker, "read_part", stuck)
    config = file_config(tmp_path, load_mode=mode, load_timeout_seconds=0.3)
    dst = Engine(config, src.layout, seed=2)
    before = dst.blocks_bytes([11, 12, 13, 14]).clone()
    start = time.monotonic()
    dst.load(make_request("b", 18), table(src.layout, DST_TABLES, {2: 3}))
    out = dst.finish("b") if mode == "async" else dst.worker.get_finished([])
    assert 0.25 < time.monotonic() - start < 5
    assert out.failed_recving == {"b": "timeout"}
    release.set()  # the read returns after all ...
    wait_for(
        lambda: "late_loads_dropped" in flat_counters(dst.worker.take_stats()),
        what="the late read to be dropped",
    )
    # ... and writes nothing into blocks that may belong to another request by now
    assert torch.equal(dst.blocks_bytes([11, 12, 13, 14]), before)
    got = dst.worker.get_finished([])
    assert not (got.finished_recving or got.failed_recving or got.invalid_block_ids)
    assert not dst.worker.has_pending()
    dst.worker.shutdown()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0, -1, "30", True])
def test_load_timeout_is_validated(value: object) -> None:
    with pytest.raises(ValueError, match="load_timeout_seconds"):
        Engine(file_config("/tmp/x", load_timeout_seconds=value), make_layout())

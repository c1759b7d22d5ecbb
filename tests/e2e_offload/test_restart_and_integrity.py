"""Restarts (a new process finds the disk tier), foreign models, damaged files, a slow disk."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridkv.connectors.offloading.tiers.disk.tier import DiskTier
from tests.support.waits import wait_for

from .helpers import (
    PROMPTS,
    assert_clean,
    counters,
    generate,
    make_llm,
    offload,
    reference,
    reset_device_cache,
    sched,
)

ROOT = Path(__file__).resolve().parents[2]


def serve_in_subprocess(model: Path, disk: Path) -> dict[str, Any]:
    res = subprocess.run(
        [sys.executable, "-m", "tests.e2e_offload.serve_once", str(model), str(disk)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def files(root: Path) -> dict[Path, bytes]:
    """The stored parts (not the directory's key and budget files)."""
    return {p: p.read_bytes() for p in sorted(root.rglob("*.kvu")) if p.is_file()}


def test_a_new_process_gets_disk_hits_and_another_model_damages_nothing(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    model = checkpoints["granitemoehybrid"]
    want = reference(model, PROMPTS[:2])
    first = serve_in_subprocess(model, tmp_path)
    assert first["token_ids"] == want
    assert first["cached"][0] == {"local": 0}
    before = files(tmp_path)
    assert before and first["counters"]["stores.disk"] == len(before) // 2  # 2 parts per unit
    second = serve_in_subprocess(model, tmp_path)
    assert second["token_ids"] == want
    assert second["cached"][0] == {"local": 0, "disk": 128}
    assert second["counters"]["hits.disk"] >= 4

    other = checkpoints["qwen3"]
    llm = make_llm(other, offload(disk=tmp_path))
    outs = generate(llm, PROMPTS[:2])
    assert [o.token_ids for o in outs] == reference(other, PROMPTS[:2])
    assert all("disk" not in o.cached_tokens for o in outs[:1])
    assert all(files(tmp_path)[p] == data for p, data in before.items())
    llm.engine.shutdown()


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "flip":
        path.write_bytes(data[:-7] + bytes([data[-7] ^ 0x40]) + data[-6:])
    elif how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:
        path.unlink()


@pytest.mark.parametrize("arch", ["qwen3", "granitemoehybrid"])
def test_damaged_files_are_recomputed_counted_and_removed(
    arch: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    model = checkpoints[arch]
    want = reference(model, PROMPTS[:4])
    llm = make_llm(model, offload(disk=tmp_path))
    outs = generate(llm, PROMPTS[:1])
    disk = sched(llm).disk
    assert disk is not None
    unit = PROMPTS[0][:64]  # the unit ending at 64: its full-attention part
    from hybridkv.kv.hashing import BlockHasher, get_hash_fn

    hashes: list[Any] = []
    BlockHasher(16, get_hash_fn("sha256")).extend(hashes, unit)
    group = llm.engine.layout.attention_group_ids[0]
    removed_before = 0.0
    for i, (how, reason) in enumerate(
        [("flip", "corrupt"), ("truncate", "truncated"), ("delete", "missing")]
    ):
        victim = Path(disk.path(hashes[3], group))
        assert victim.exists()
        damage(victim, how)
        reset_device_cache(llm)
        outs += generate(llm, PROMPTS[i + 1 : i + 2])
        assert counters(llm)[f"load_failures:{reason}"] == 1
        assert "disk" not in outs[-1].cached_tokens  # recomputed, not served
        removed = counters(llm).get("files_removed", 0)
        assert (removed > removed_before) is (how != "delete")  # the unit's files went
        removed_before = removed
        # the bad file went; the recomputed unit was stored again as a good one
        assert worker_idle(llm)
        assert disk.read(hashes[3], 64, group).numel() > 0
    assert [o.token_ids for o in outs] == want
    transfer = llm.engine.scheduler.transfer
    assert transfer is not None and transfer.stats.failed_requests == 3
    assert_clean(llm)


def worker_idle(llm: Any) -> bool:
    from .helpers import worker

    return bool(worker(llm).wait_for_saves(10.0))


def test_slow_disk_times_out_into_recompute(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = checkpoints["qwen3"]
    want = reference(model, PROMPTS[:2])
    llm = make_llm(model, offload(disk=tmp_path, load_timeout_seconds=0.2))
    outs = generate(llm, PROMPTS[:1])
    reset_device_cache(llm)
    fast_read = DiskTier.read

    def slow_read(self: DiskTier, *args: Any) -> torch.Tensor:
        time.sleep(0.6)
        return fast_read(self, *args)

    monkeypatch.setattr(DiskTier, "read", slow_read)
    outs += generate(llm, PROMPTS[1:2])
    assert [o.token_ids for o in outs] == want
    c = counters(llm)
    assert c["timeouts"] == 1 and c["load_failures:timeout"] == 1
    disk = sched(llm).disk
    assert disk is not None
    # the abandoned read stops after its current part and unpins
    wait_for(lambda: not disk.index.num_pinned(), 5, what="the abandoned read to unpin")
    assert_clean(llm)

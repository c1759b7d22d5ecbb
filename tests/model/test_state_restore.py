"""State checkpoints: save at a block boundary, restore into another request's live slot."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridkv.step_io import StateCopy
from tests.model.conftest import make_runner
from tests.support.checkpoints import hf_logits
from tests.support.driver import RunnerDriver

BOUNDARY = 32  # two blocks of 16


@pytest.mark.parametrize("arch", ["granitemoehybrid", "granitemoehybrid_moe"])
def test_restored_checkpoint_continues_like_a_fresh_prefill(
    arch: str, hf_checkpoints: dict[str, Path]
) -> None:
    model_dir = hf_checkpoints[arch]
    gen = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, 1000, (BOUNDARY,), generator=gen).tolist()
    first = prefix + torch.randint(3, 1000, (16,), generator=gen).tolist()
    second = prefix + torch.randint(3, 1000, (21,), generator=gen).tolist()
    driver = RunnerDriver(make_runner(model_dir))
    (group_id,) = driver.layout.state_group_ids
    checkpoint = driver.take_slot()
    r1 = driver.add("r1", first)
    driver.step({"r1": BOUNDARY}, saves=[StateCopy(group_id, r1.slots[0], checkpoint)])
    r2 = driver.add("r2", second)
    r2.tables = [list(t[: BOUNDARY // 16]) for t in r1.tables]  # share the prefix's KV blocks
    r2.computed = BOUNDARY
    restore = StateCopy(group_id, checkpoint, r2.slots[0])
    driver.step({"r1": 16, "r2": 9}, restores=[restore], restored={"r2"})
    driver.step({"r2": 12})
    driver.decode_all(["r2"], 3)
    ours = driver.all_logits("r2")  # positions [BOUNDARY, computed)
    ref = hf_logits(model_dir, r2.tokens[: r2.computed])[BOUNDARY:]
    assert (ours - ref).abs().max().item() < 1e-4
    # r1 kept running from its own live slot, untouched by the restore
    ref1 = hf_logits(model_dir, r1.tokens[: r1.computed])
    assert (driver.all_logits("r1") - ref1).abs().max().item() < 1e-4


def test_restore_without_checkpoint_differs(hf_checkpoints: dict[str, Path]) -> None:
    """Control: continuing from a zero state instead of the checkpoint gives other logits."""
    model_dir = hf_checkpoints["granitemoehybrid"]
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(3, 1000, (BOUNDARY + 8,), generator=gen).tolist()
    driver = RunnerDriver(make_runner(model_dir))
    r1 = driver.add("r1", tokens)
    driver.step({"r1": BOUNDARY})
    r2 = driver.add("r2", tokens)
    r2.tables = [list(t[: BOUNDARY // 16]) for t in r1.tables]
    r2.computed = BOUNDARY
    driver.step({"r2": 8}, restored={"r2"})  # live slot left zero: no restore
    ref = hf_logits(model_dir, tokens)[BOUNDARY:]
    assert (driver.all_logits("r2") - ref).abs().max().item() > 1e-2

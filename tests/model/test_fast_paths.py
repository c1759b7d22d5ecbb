"""The runner's shortcuts give the same numbers as the general paths: batches of equal-length
prompts from position 0 (dense queries, plain causal attention) and Mamba decode on slots that
are not one ascending run (gather/scatter instead of in-place views)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.model.conftest import make_runner
from tests.support.checkpoints import HF_ARCHS, hf_logits
from tests.support.driver import RunnerDriver

TOL = 1e-4


@pytest.mark.parametrize("arch", HF_ARCHS)
@pytest.mark.parametrize("prompt_len", [20, 45])  # below and above the sliding window (32)
def test_equal_length_prompts_match_transformers(
    arch: str, prompt_len: int, hf_checkpoints: dict[str, Path]
) -> None:
    gen = torch.Generator().manual_seed(1)
    driver = RunnerDriver(make_runner(hf_checkpoints[arch]))
    for rid in ("a", "b", "c"):
        driver.add(rid, torch.randint(3, 1000, (prompt_len,), generator=gen).tolist())
    driver.step(dict.fromkeys("abc", prompt_len))  # one dense prefill step
    driver.decode_all(list("abc"), 3)  # dense decode steps
    for rid, req in driver.requests.items():
        ref = hf_logits(hf_checkpoints[arch], req.tokens[: req.computed])
        diff = (driver.all_logits(rid) - ref).abs().max().item()
        assert diff < TOL, f"{arch} request {rid}: max |logit diff| {diff:.2e}"


def test_mamba_decode_on_scattered_slots_matches_a_run(hf_checkpoints: dict[str, Path]) -> None:
    model_dir = hf_checkpoints["granitemoehybrid"]
    prompts = {"a": list(range(3, 20)), "b": list(range(30, 41)), "c": list(range(50, 75))}
    logits = []
    for slots in ([0, 1, 2], [5, 1, 3]):  # one ascending run; scattered and out of order
        driver = RunnerDriver(make_runner(model_dir, num_state_slots=8))
        for (rid, prompt), slot in zip(prompts.items(), slots, strict=True):
            driver.add(rid, prompt).slots = [slot] * len(driver.layout.state_group_ids)
        driver.step({rid: len(p) for rid, p in prompts.items()})
        driver.decode_all(list(prompts), 4)
        logits.append(torch.cat([driver.all_logits(rid) for rid in prompts]))
    assert (logits[0] - logits[1]).abs().max().item() < 1e-5


def test_mamba_decode_kernel_matches_the_torch_step(
    hf_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hybridkv.model.layers import mamba2

    model_dir = hf_checkpoints["granitemoehybrid"]
    prompts = {"a": list(range(3, 20)), "b": list(range(30, 41))}
    logits = []
    for native in (True, False):
        if not native:
            monkeypatch.setattr(mamba2, "load_ssm", lambda: None)
        driver = RunnerDriver(make_runner(model_dir))
        for rid, prompt in prompts.items():
            driver.add(rid, prompt)
        driver.step({rid: len(p) for rid, p in prompts.items()})
        driver.decode_all(list(prompts), 3)
        logits.append(torch.cat([driver.all_logits(rid) for rid in prompts]))
    assert (logits[0] - logits[1]).abs().max().item() < 1e-5

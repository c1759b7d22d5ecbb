"""Our runner against transformers on tiny random checkpoints, float32: logits at every
position within 1e-4 and identical greedy tokens, with chunked prefill, mixed prefill and
decode steps, sliding windows and Mamba chunks exceeded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.model.conftest import make_runner
from tests.support.checkpoints import HF_ARCHS, hf_greedy, hf_logits
from tests.support.driver import RunnerDriver

TOL = 1e-4
NUM_DECODE = 8

# prompt lengths: below the window (32) and the mamba chunk (16), above both, well above
PROMPT_LENS = {"a": 5, "b": 20, "c": 45, "d": 70}
# tokens per step while prefilling; chunk ends are deliberately not block (16) aligned
PREFILL_PLAN = [
    {"a": 5, "b": 7, "c": 13, "d": 30},
    {"a": 1, "b": 13, "c": 19, "d": 10},
    {"a": 1, "b": 1, "c": 13, "d": 17},
    {"a": 1, "b": 1, "c": 1, "d": 13},
]


def make_prompts(seed: int = 0) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return {
        rid: torch.randint(3, 1000, (n,), generator=gen).tolist() for rid, n in PROMPT_LENS.items()
    }


def run_plan(model_dir: Path) -> RunnerDriver:
    driver = RunnerDriver(make_runner(model_dir))
    for rid, prompt in make_prompts().items():
        driver.add(rid, prompt)
    for plan in PREFILL_PLAN:
        driver.step(plan)
    driver.decode_all(list(PROMPT_LENS), NUM_DECODE)
    return driver


@pytest.mark.parametrize("arch", HF_ARCHS)
def test_logits_match_transformers_at_every_position(
    arch: str, hf_checkpoints: dict[str, Path]
) -> None:
    model_dir = hf_checkpoints[arch]
    driver = run_plan(model_dir)
    for rid, req in driver.requests.items():
        ours = driver.all_logits(rid)  # [computed, V]
        ref = hf_logits(model_dir, req.tokens[: req.computed])
        diff = (ours - ref).abs().max().item()
        assert diff < TOL, f"{arch} request {rid}: max |logit diff| {diff:.2e}"
        assert len(req.output) >= NUM_DECODE + 1


@pytest.mark.parametrize("arch", HF_ARCHS)
def test_greedy_tokens_match_generate(arch: str, hf_checkpoints: dict[str, Path]) -> None:
    model_dir = hf_checkpoints[arch]
    driver = run_plan(model_dir)
    for rid, req in driver.requests.items():
        ref_tokens, ref_logits = hf_greedy(model_dir, req.prompt, len(req.output))
        assert req.output == ref_tokens, f"{arch} request {rid}"
        kept = torch.tensor(req.sampled_logits)  # the rows the runner sampled from
        assert (kept - torch.stack(ref_logits)).abs().max().item() < TOL

"""bfloat16 weights and KV: sane outputs close to float32 (no exact match expected), whether
products run natively in bfloat16 or in float32 (``hybridkv.model.loading.matmul``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.model.conftest import make_runner
from tests.model.test_parity import PREFILL_PLAN, PROMPT_LENS, make_prompts
from tests.support.checkpoints import hf_logits
from tests.support.driver import RunnerDriver


@pytest.mark.parametrize("bf16_matmul", ["native", "float32"])
@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "granitemoehybrid_moe"])
def test_bfloat16_is_close_to_float32(
    arch: str, bf16_matmul: str, hf_checkpoints: dict[str, Path]
) -> None:
    model_dir = hf_checkpoints[arch]
    runner = make_runner(model_dir, dtype="bfloat16", bf16_matmul=bf16_matmul)
    matmul = torch.bfloat16 if bf16_matmul == "native" else torch.float32
    assert runner.model.lm_head.weight.dtype == matmul
    assert runner.model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert all(t.dtype == torch.bfloat16 for t in runner.cache.kv_pages.values())
    driver = RunnerDriver(runner)
    for rid, prompt in make_prompts().items():
        driver.add(rid, prompt)
    for plan in PREFILL_PLAN:
        driver.step(plan)
    driver.decode_all(list(PROMPT_LENS), 4)
    for rid, req in driver.requests.items():
        ours = driver.all_logits(rid)
        ref = hf_logits(model_dir, req.tokens[: req.computed])
        assert torch.isfinite(ours).all()
        cos = torch.nn.functional.cosine_similarity(ours, ref, dim=-1)
        assert cos.min().item() > 0.98, f"{arch} {rid}: cosine {cos.min().item():.3f}"
        top1 = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
        assert top1 > 0.8, f"{arch} {rid}: top-1 agreement {top1:.2f}"

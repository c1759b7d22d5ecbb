"""Shared fixtures: tiny transformers-built checkpoints (built once per session) and runners."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridkv.kv.spec import create_layout
from hybridkv.model.loading.loader import load_model
from hybridkv.model.step.runner import ModelRunner
from tests.support.checkpoints import HF_ARCHS, SharedCheckpoints


@pytest.fixture(scope="session")
def hf_checkpoints(shared_checkpoints: SharedCheckpoints) -> dict[str, Path]:
    return {arch: shared_checkpoints.get(arch) for arch in HF_ARCHS}


def make_runner(
    model_dir: Path,
    dtype: str = "float32",
    block_size: int = 16,
    num_blocks: int = 256,
    num_state_slots: int = 16,
    bf16_matmul: str = "auto",
    keep_logits: bool = True,
) -> ModelRunner:
    model, cfg = load_model(model_dir, dtype, bf16_matmul)
    layout = create_layout(cfg.layer_specs(block_size, dtype))
    return ModelRunner(model, cfg, layout, num_blocks, num_state_slots, keep_logits=keep_logits)

"""Tiny checkpoints (built once per session) and the no-caching reference outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checkpoints import make_hf_checkpoint

ARCHS = ("qwen3", "gemma3", "granitemoehybrid")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("offload_ckpts")
    return {arch: make_hf_checkpoint(arch, root / arch) for arch in ARCHS}

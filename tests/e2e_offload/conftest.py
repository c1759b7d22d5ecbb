"""Tiny checkpoints (built once per session) and the no-caching reference outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checkpoints import SharedCheckpoints

ARCHS = ("qwen3", "gemma3", "granitemoehybrid")


@pytest.fixture(scope="session")
def checkpoints(shared_checkpoints: SharedCheckpoints) -> dict[str, Path]:
    return {arch: shared_checkpoints.get(arch) for arch in ARCHS}

"""Session fixtures: the tiny transformers-built checkpoints, built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.checkpoints import HF_ARCHS, SharedCheckpoints


@pytest.fixture(scope="session")
def checkpoints(shared_checkpoints: SharedCheckpoints) -> dict[str, Path]:
    return {arch: shared_checkpoints.get(arch) for arch in HF_ARCHS}

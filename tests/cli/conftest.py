"""Session fixtures: the tiny transformers-built checkpoints, built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.helpers import build_checkpoints


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_checkpoints(tmp_path_factory.mktemp("engine_ckpts"))

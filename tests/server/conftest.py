"""The tiny random Granite 4.0-H checkpoint the real-server tests serve, built once."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hybridkv.model.loading.make_model import make_model

    return make_model("granitemoehybrid", tmp_path_factory.mktemp("model"), size="tiny", seed=0)

"""Tiny checkpoints for the disaggregation tests, built once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.checkpoints import make_hf_checkpoint


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    root = tmp_path_factory.mktemp("e2e_pd_ckpts")
    built: dict[str, Path] = {}

    def build(arch: str, name: str | None = None, seed: int = 0, **overrides: Any) -> Path:
        key = name or arch
        if key not in built:
            built[key] = make_hf_checkpoint(arch, root / key, seed=seed, **overrides)
        return built[key]

    return build

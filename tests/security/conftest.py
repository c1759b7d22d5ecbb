"""Tiny checkpoints for the security tests, built once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.checkpoints import make_hf_checkpoint


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    root = tmp_path_factory.mktemp("security_ckpts")
    built: dict[str, Path] = {}

    def build(arch: str, seed: int = 0) -> Path:
        key = f"{arch}-{seed}"
        if key not in built:
            built[key] = make_hf_checkpoint(arch, root / key, seed=seed)
        return built[key]

    return build

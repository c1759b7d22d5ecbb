"""Checkpoints for the fault acceptance tests: built once per session, on demand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.checkpoints import make_hf_checkpoint

Builder = Callable[..., Path]


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    """``checkpoint(arch, **overrides)`` -> a tiny transformers-built checkpoint (memoised)."""
    root = tmp_path_factory.mktemp("e2e_faults_ckpts")
    built: dict[str, Path] = {}

    def build(arch: str, name: str | None = None, **overrides: Any) -> Path:
        key = name or arch
        if key not in built:
            built[key] = make_hf_checkpoint(arch, root / key, **overrides)
        return built[key]

    return build

"""Checkpoints for the fault acceptance tests: built once per session, on demand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.checkpoints import SharedCheckpoints

Builder = Callable[..., Path]


@pytest.fixture(scope="session")
def checkpoint(shared_checkpoints: SharedCheckpoints) -> Builder:
    """``checkpoint(arch, name=None, **overrides)`` -> a tiny transformers-built checkpoint
    (memoised for the session)."""
    return shared_checkpoints.get

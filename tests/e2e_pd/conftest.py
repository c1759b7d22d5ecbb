"""Tiny checkpoints for the disaggregation tests, built once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.checkpoints import SharedCheckpoints


@pytest.fixture(scope="session")
def checkpoint(shared_checkpoints: SharedCheckpoints) -> Callable[..., Path]:
    """``checkpoint(arch, name=None, seed=0, **overrides)`` (memoised for the session)."""
    return shared_checkpoints.get

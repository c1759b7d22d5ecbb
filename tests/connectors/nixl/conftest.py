"""Tiny checkpoints for the NixlConnector tests, built once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.checkpoints import SharedCheckpoints


@pytest.fixture(scope="session")
def checkpoint(shared_checkpoints: SharedCheckpoints) -> Callable[..., Path]:
    """``checkpoint(arch, seed=0)`` (memoised for the session)."""
    return shared_checkpoints.get

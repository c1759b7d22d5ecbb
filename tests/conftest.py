"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from hybridkv.native import PageCopy, load_pagecopy
from tests.support import lifetimes


@pytest.fixture(scope="session")
def native() -> PageCopy:
    """The native page-copy kernels. Skipped only where they cannot exist (no C compiler, or
    ``HYBRIDKV_NATIVE=0``); with a compiler present, a failed build fails the test."""
    kernel = load_pagecopy()
    if kernel is not None:
        return kernel
    if os.environ.get("HYBRIDKV_NATIVE") == "0":
        pytest.skip("HYBRIDKV_NATIVE=0")
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler: the native kernels cannot be built here")
    pytest.fail("a C compiler is present but the native kernels did not build (see the log)")


@pytest.fixture(autouse=True, scope="session")
def _close_session_engines() -> Iterator[None]:
    """What a builder cached for the session (``lifetimes.keep``) is closed at its end."""
    yield
    lifetimes.close_session()


@pytest.fixture(autouse=True, scope="module")
def _close_module_engines() -> Iterator[None]:
    """Engines a module's fixtures built (``lifetimes.track``) are closed when it ends."""
    start = lifetimes.mark()
    yield
    lifetimes.close_since(start)


@pytest.fixture(autouse=True)
def _close_test_engines() -> Iterator[None]:
    """Engines and connector doubles a test built are closed when it ends, failed or not."""
    start = lifetimes.mark()
    yield
    lifetimes.close_since(start)

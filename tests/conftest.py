"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import shutil

import pytest

from hybridkv.native import PageCopy, load_pagecopy


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

"""Child processes that never outlive the test or benchmark that started them."""

from __future__ import annotations

import contextlib
import ctypes
import signal


def die_with_parent() -> None:
    """In the child before exec: the kernel sends it SIGTERM when its parent dies, so a killed
    test or benchmark (SIGTERM, SIGKILL) leaves no server or worker behind (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

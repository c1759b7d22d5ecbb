"""``PartError``: a stored part (a file, a CPU buffer, a remote value) that cannot be used.

Shared by every store of KV parts (``file/``, ``offloading/tiers/``): a reader that meets a
part failing any check raises ``PartError`` with its ``FailureReason``, never returns bytes, and
the stats count it by reason.
"""

from __future__ import annotations

from hybridkv.step_io import FailureReason

MISSING = FailureReason.MISSING  # no such part
TRUNCATED = FailureReason.TRUNCATED
CORRUPT = FailureReason.CORRUPT
MISMATCH = FailureReason.MISMATCH  # another layout's, another key's, an older version's
IO_ERROR = FailureReason.IO_ERROR


class PartError(Exception):
    """A stored part that cannot be used; ``reason`` is one of the constants above."""

    def __init__(self, reason: FailureReason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason

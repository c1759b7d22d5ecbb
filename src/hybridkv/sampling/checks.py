"""Value checks shared by ``SamplingParams`` and ``StructuredOutputsParams``: every error names
the field, and a hostile value is never echoed whole."""

from __future__ import annotations

import math


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check(ok: bool, name: str, value: object, want: str) -> None:
    if not ok:
        raise ValueError(f"invalid sampling parameter {name}={short(value)}: must be {want}")


def check_range(name: str, value: object, low: float, high: float) -> None:
    ok = is_real(value) and low <= value <= high  # type: ignore[operator]
    check(ok, name, value, f"a finite number in [{low}, {high}]")


def check_token_ids(name: str, ids: tuple[int, ...], limit: int) -> None:
    check(len(ids) <= limit, name, ids, f"at most {limit} ids")
    check(all(is_int(t) and t >= 0 for t in ids), name, ids, "token ids >= 0")


def short(value: object, limit: int = 120) -> str:
    """``repr(value)``, cut: a hostile value (300,000 stop strings) must not fill the error."""
    text = repr(value)
    if isinstance(value, tuple | list | dict) and len(value) > 8:
        text = f"<{len(value)} items>"
    return text if len(text) <= limit else text[:limit] + "..."

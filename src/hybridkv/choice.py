"""``Choice``: the base of every enum of option values and names (a leaf module).

A member equals, prints and formats as its value (as ``enum.StrEnum`` does on Python 3.11+), so
metric labels, messages and JSON read the same as the plain strings they replace.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar


class Choice(str, Enum):
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


C = TypeVar("C", bound=Choice)


def parse_choice(kind: type[C], value: object, where: str) -> C:
    """``value`` as a member of ``kind`` (by value), or a ValueError naming ``where``."""
    try:
        return kind(value)
    except ValueError:
        choices = [m.value for m in kind]
        raise ValueError(f"{where}={value!r} must be one of {choices}") from None

"""``Choice``: the base of every enum of option values and names (a leaf module), and
``json_object``: an option object given as a dict or as JSON text.

A member equals, prints and formats as its value (as ``enum.StrEnum`` does on Python 3.11+), so
metric labels, messages and JSON read the same as the plain strings they replace.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar


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


def json_object(value: object, option: str, keys: Sequence[str]) -> Mapping[str, Any]:
    """``value`` (a dict, or JSON text as the CLI passes it) as a mapping with no key outside
    ``keys``; errors name ``option`` (and list ``keys`` in the order given)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{option} is not valid JSON: {exc.msg}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{option} must be a JSON object")
    unknown = set(value) - set(keys)
    if unknown:
        raise ValueError(f"{option}: unknown keys {sorted(unknown)}; known: {list(keys)}")
    return value

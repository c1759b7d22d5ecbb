"""Reading JSON a model is still writing: where a value ends, and an object's fields so far.

A tool call streams as its text arrives, so its parser reads a JSON object that may stop
anywhere. ``value_end`` finds where a complete value ends (None: the text stops inside it);
``object_fields`` reads the top-level fields of an object as ``name -> Span`` without
decoding the values (an argument object's own text is what the client receives). Nothing here
raises on bad JSON: a malformed object gives ``None`` and the parser treats the text as text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_SCALAR = re.compile(r"-?[0-9][0-9eE.+-]*|true|false|null")
_WS = " \t\r\n"
_STRUCTURE = re.compile(r'\\.|["{}\[\]]', re.DOTALL)  # an escape pair, a quote, a bracket


@dataclass(frozen=True, slots=True)
class Span:
    """A value's text: ``text[start:end]``; ``end`` None while the text stops inside it."""

    start: int
    end: int | None


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value starting at ``text[start]``, or None if the text
    ends before the value does (a number at the very end may still grow: None too)."""
    if start >= len(text):
        return None
    if text[start] not in '{["':
        match = _SCALAR.match(text, start)
        if match is None:
            return start  # not a value: an empty span, the caller refuses it
        return match.end() if match.end() < len(text) else None
    depth, in_string = 0, False
    for match in _STRUCTURE.finditer(text, start):  # jumps over ordinary characters in C
        c = match.group()
        if in_string:
            if c == '"':
                in_string = False
                if depth == 0:
                    return match.end()
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return match.end()
    return None


def object_fields(text: str, start: int) -> tuple[dict[str, Span], int | None] | None:
    """The fields of the object at ``text[start] == "{"`` read so far, and the index past its
    ``}`` (None: not closed yet); None if the text is not such an object."""
    if start >= len(text) or text[start] != "{":
        return None
    fields: dict[str, Span] = {}
    i = skip_ws(text, start + 1)
    if i < len(text) and text[i] == "}":
        return fields, i + 1
    while i < len(text):
        key_end = value_end(text, i) if text[i] == '"' else i
        if key_end is None:
            return fields, None
        if key_end == i:
            return None
        key = json.loads(text[i:key_end])
        i = skip_ws(text, key_end)
        if i >= len(text):
            return fields, None
        if text[i] != ":":
            return None
        i = skip_ws(text, i + 1)
        if i >= len(text):
            return fields, None
        end = value_end(text, i)
        fields[key] = Span(i, end)
        if end is None:
            return fields, None
        if end == i:
            return None
        i = skip_ws(text, end)
        if i >= len(text):
            return fields, None
        if text[i] == "}":
            return fields, i + 1
        if text[i] != ",":
            return None
        i = skip_ws(text, i + 1)
    return fields, None


def try_load(text: str) -> Any:
    """The decoded value, or None for text that is not JSON (or nested too deep to read)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None

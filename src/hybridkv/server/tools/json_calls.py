"""Calls written as JSON objects ``{"name": ..., "arguments": {...}}`` (``parameters`` in
Llama's and vLLM's ``required`` format), read while they stream: hermes, granite, llama3_json
and ``tool_choice=required`` share this. The arguments are sent as the model wrote them (their
own JSON text), so what a stream sent is always a prefix of the final text."""

from __future__ import annotations

from hybridkv.server.tools.base import ToolCallDraft
from hybridkv.server.tools.json_scan import object_fields, skip_ws, try_load

ARGUMENT_KEYS = ("arguments", "parameters")


def read_call(text: str, start: int) -> tuple[ToolCallDraft, int | None] | None:
    """The call object at ``text[start] == "{"`` and the index past it (None: not closed);
    None if it is not a call object (bad JSON, a name that is not a string...)."""
    read = object_fields(text, start)
    if read is None:
        return None
    fields, end = read
    name: str | None = None
    span = fields.get("name")
    if span is not None and span.end is not None:
        value = try_load(text[span.start : span.end])
        if not isinstance(value, str):
            return None
        name = value
    args = next((fields[k] for k in ARGUMENT_KEYS if k in fields), None)
    if args is None:
        arguments = "{}" if end is not None else ""
    elif text[args.start] == '"':  # an object written as a JSON string: sent once whole
        decoded = "" if args.end is None else _string_object(text[args.start : args.end])
        if decoded is None:
            return None
        arguments = decoded
    else:
        arguments = text[args.start : len(text) if args.end is None else args.end]
        if args.end is not None and not isinstance(try_load(arguments), dict):
            return None
    complete = end is not None and name is not None
    return ToolCallDraft(name, arguments, complete), end


def _string_object(value: str) -> str | None:
    """``"{\\"x\\": 1}"`` (arguments some models encode twice) as ``{"x": 1}``; None if
    the string does not hold a JSON object."""
    inner = try_load(value)
    return inner if isinstance(inner, str) and isinstance(try_load(inner), dict) else None


def read_call_list(text: str, start: int) -> tuple[list[ToolCallDraft], int | None] | None:
    """The JSON list of call objects at ``text[start] == "["`` and the index past its ``]``;
    None if it is not such a list."""
    if start >= len(text) or text[start] != "[":
        return None
    calls: list[ToolCallDraft] = []
    i = skip_ws(text, start + 1)
    while i < len(text):
        if text[i] == "]" and not calls:
            return calls, i + 1
        read = read_call(text, i)
        if read is None:
            return None
        call, end = read
        calls.append(call)
        if end is None:
            return calls, None
        i = skip_ws(text, end)
        if i < len(text) and text[i] == "]":
            return calls, i + 1
        if i < len(text) and text[i] != ",":
            return None
        i = skip_ws(text, i + 1)
    return calls, None

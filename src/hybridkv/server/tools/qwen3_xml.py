"""``qwen3_xml`` / ``qwen3_coder``: Qwen3.5 and Qwen3-Coder write each call as XML-like tags,
one parameter per tag, values as plain text::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A value is typed by the tool's JSON schema (``string`` stays text, ``integer`` / ``number`` /
``boolean`` are converted, ``object`` / ``array`` read as JSON); the arguments are sent as the
JSON object ``{"city": "Paris", "days": 3}``, one whole parameter at a time while streaming.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from hybridkv.server.tools.base import (
    BaseToolParser,
    ParsedTools,
    ToolCallDraft,
    content_before,
    finished,
)
from hybridkv.server.tools.json_scan import try_load

START, END = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"<function=([^>\n]+)>")
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_FUNCTION_END = "</function>"


class Qwen3XmlToolParser(BaseToolParser):
    name = "qwen3_xml"

    def parse(self, text: str, final: bool) -> ParsedTools:
        first = text.find(START)
        content = content_before(text, len(text) if first < 0 else first, final, [START])
        calls = []
        at = first
        while at >= 0:
            close = text.find(END, at)
            block = text[at + len(START) : len(text) if close < 0 else close]
            call = self._call(block, closed=close >= 0 or final)
            if call is None:
                break
            calls.append(call)
            at = -1 if close < 0 else text.find(START, close)
        parsed = ParsedTools(content, calls)
        return finished(parsed, text) if final else parsed

    def _call(self, block: str, closed: bool) -> ToolCallDraft | None:
        match = _FUNCTION.search(block)
        if match is None:
            return None
        name = match.group(1).strip()
        body_end = block.find(_FUNCTION_END, match.end())
        body = block[match.end() : len(block) if body_end < 0 else body_end]
        types = self.spec.parameters.get(name, {})
        parts = [
            f"{json.dumps(p.strip(), ensure_ascii=False)}: "
            f"{json.dumps(typed_value(v, types.get(p.strip())), ensure_ascii=False)}"
            for p, v in _PARAMETER.findall(body)
        ]
        complete = body_end >= 0 and closed
        arguments = "{" + ", ".join(parts) + ("}" if complete else "")
        return ToolCallDraft(name, arguments, complete)


class Qwen3CoderToolParser(Qwen3XmlToolParser):
    name = "qwen3_coder"


def typed_value(raw: str, schema: Any) -> Any:
    """A parameter's text as the type its schema names (text if none or if it does not read
    as that type); one newline around the value is the format's, not the value's."""
    value = raw.removeprefix("\n").removesuffix("\n")
    kind = schema.get("type") if isinstance(schema, dict) else None
    if value.strip().lower() == "null" and kind != "string":
        return None
    if kind in ("integer", "int"):
        return _number(value, int)
    if kind in ("number", "float"):
        number = _number(value, float)
        return int(number) if isinstance(number, float) and number.is_integer() else number
    if kind in ("boolean", "bool"):
        lowered = value.strip().lower()
        return lowered == "true" if lowered in ("true", "false") else value
    if kind in ("object", "array"):
        loaded = try_load(value)
        return value if loaded is None else loaded
    return value


def _number(value: str, kind: type) -> Any:
    try:
        number = kind(value.strip())
    except ValueError:
        return value
    return number if math.isfinite(number) else value  # JSON has no NaN nor infinity

"""``llama3_json``: Llama 3.1+'s JSON tool calling: the whole answer is one call object (after
an optional ``<|python_tag|>``), or several separated by ``;``, with ``parameters`` (or
``arguments``)::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}

An answer that starts with anything else is content."""

from __future__ import annotations

from hybridkv.server.tools.base import (
    BaseToolParser,
    ParsedTools,
    ToolCallDraft,
    finished,
    leading,
    no_calls,
)
from hybridkv.server.tools.json_calls import read_call
from hybridkv.server.tools.json_scan import skip_ws

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(BaseToolParser):
    name = "llama3_json"
    keeps_special_tokens = True  # <|python_tag|> is a special token

    def parse(self, text: str, final: bool) -> ParsedTools:
        i = leading(text, [PYTHON_TAG], final)
        if i is None:
            return no_calls("")
        rest = text[i:]
        if rest.startswith(PYTHON_TAG):
            i = skip_ws(text, i + len(PYTHON_TAG))
        elif not rest.startswith("{"):
            return no_calls(text)
        calls: list[ToolCallDraft] = []
        while i < len(text):
            read = read_call(text, i)
            if read is None:
                return no_calls(text) if final else ParsedTools("", calls)
            call, end = read
            calls.append(call)
            if end is None:
                break
            i = skip_ws(text, end)
            if i < len(text) and text[i] != ";":
                return no_calls(text) if final else ParsedTools("", calls)
            i = skip_ws(text, i + 1)
        parsed = ParsedTools("", calls)
        return finished(parsed, text) if final else parsed

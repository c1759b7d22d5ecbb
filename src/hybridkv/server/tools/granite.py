"""``granite``: Granite 3.x writes one JSON list of calls after ``<|tool_call|>`` (or
``<tool_call>``); Granite 4.0's template asks for hermes blocks (``<tool_call>{...}
</tool_call>``), which this parser reads too::

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]

An answer that starts with anything else is content (vLLM's rule)."""

from __future__ import annotations

from hybridkv.server.tools.base import BaseToolParser, ParsedTools, finished, leading, no_calls
from hybridkv.server.tools.hermes import START, tagged_json_calls
from hybridkv.server.tools.json_calls import read_call_list
from hybridkv.server.tools.json_scan import skip_ws

MARKERS = ("<|tool_call|>", START)


class GraniteToolParser(BaseToolParser):
    name = "granite"
    keeps_special_tokens = True  # <|tool_call|> is a special token

    def parse(self, text: str, final: bool) -> ParsedTools:
        i = leading(text, MARKERS, final)
        if i is None:
            return no_calls("")
        rest = text[i:]
        marker = next((m for m in MARKERS if rest.startswith(m)), None)
        body = skip_ws(text, i + len(marker)) if marker else i
        if marker == START and body < len(text) and text[body] == "{":
            calls = tagged_json_calls(text, i, final)
        elif body >= len(text):
            return no_calls("" if marker and not final else text)
        else:
            read = read_call_list(text, body)
            calls = None if read is None else read[0]
        if calls is None:
            return no_calls(text if final or not marker else "")
        parsed = ParsedTools("", calls)
        return finished(parsed, text) if final else parsed

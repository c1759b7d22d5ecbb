"""``hermes``: Qwen3, Qwen3-Next, Hermes 2 Pro and later, Granite 4.0 (their templates ask for
it): each call is a JSON object between tags, content before the first one::

    Let me look.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
"""

from __future__ import annotations

from hybridkv.server.tools.base import (
    BaseToolParser,
    ParsedTools,
    ToolCallDraft,
    content_before,
    finished,
)
from hybridkv.server.tools.json_calls import read_call
from hybridkv.server.tools.json_scan import skip_ws

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(BaseToolParser):
    name = "hermes"
    keeps_special_tokens = True  # some tokenizers mark <tool_call> special (vLLM's choice)

    def parse(self, text: str, final: bool) -> ParsedTools:
        first = text.find(START)
        content = content_before(text, len(text) if first < 0 else first, final, [START])
        calls = [] if first < 0 else tagged_json_calls(text, first, final)
        if calls is None:
            return ParsedTools(text if final else content, [])
        parsed = ParsedTools(content, calls)
        return finished(parsed, text) if final else parsed


def tagged_json_calls(text: str, at: int, final: bool) -> list[ToolCallDraft] | None:
    """The calls of ``<tool_call>{...}</tool_call>`` blocks from ``at``; None if one is not a
    call object. The last block's closing tag may be missing once the text is ``final``."""
    calls = []
    while at >= 0:
        body_start = skip_ws(text, at + len(START))
        close = text.find(END, body_start)
        if body_start >= len(text):
            break
        read = read_call(text, body_start)
        if read is None:
            return None
        call, end = read
        if close < 0 and call.complete and not final:  # the closing tag may still come
            call = ToolCallDraft(call.name, call.arguments, False)
        calls.append(call)
        if close < 0 or end is None:
            break
        at = text.find(START, close + len(END))
    return calls

"""Tool calls in OpenAI's streamed shape, from a parser that reads the whole text so far.

Each update parses the text again and sends what is new: content past what was sent, a call's
first delta once its name is known (``id``, ``type``, ``function.name``, the arguments so far)
and then each new piece of its arguments::

    {"index": 0, "id": "chatcmpl-tool-…", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\\"ci"}}
    {"index": 0, "function": {"arguments": "ty\\": \\"Paris\\"}"}}

A parser's arguments so far are a prefix of its final ones (``base.py``), so the pieces add up
to the arguments of the whole response. NOTE: a call streamed and then found malformed at the
end cannot be taken back; the stream then sends nothing more (the whole response would give
the text as content).
"""

from __future__ import annotations

import uuid
from typing import Any

from hybridkv.server.tools.base import BaseToolParser, ParsedTools


def new_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def call_entries(parsed: ParsedTools, parallel: bool) -> list[dict[str, Any]]:
    """A whole response's ``tool_calls`` (only the first with ``parallel_tool_calls=false``)."""
    calls = parsed.calls if parallel else parsed.calls[:1]
    return [
        {"id": new_call_id(), "type": "function",
         "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]  # fmt: skip


class ToolCallStream:
    """What one streamed choice has sent of its content and calls."""

    def __init__(self, parser: BaseToolParser, parallel: bool = True) -> None:
        self.parser = parser
        self.parallel = parallel
        self.num_content_chars = 0
        self.num_argument_chars: list[int] = []  # per call sent

    @property
    def called(self) -> bool:
        return bool(self.num_argument_chars)

    def take(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """The new content and the ``tool_calls`` deltas of ``text`` (everything so far)."""
        parsed = self.parser.parse(text, final)
        if final and self.called and not parsed.calls:
            return "", []
        content = parsed.content[self.num_content_chars :]
        self.num_content_chars += len(content)
        deltas = []
        for i, call in enumerate(parsed.calls if self.parallel else parsed.calls[:1]):
            if call.name is None:
                break
            if i == len(self.num_argument_chars):
                self.num_argument_chars.append(len(call.arguments))
                deltas.append({"index": i, "id": new_call_id(), "type": "function",
                               "function": {"name": call.name, "arguments": call.arguments}})  # fmt: skip
                continue
            new = call.arguments[self.num_argument_chars[i] :]
            if new:
                self.num_argument_chars[i] = len(call.arguments)
                deltas.append({"index": i, "function": {"arguments": new}})
        return content, deltas

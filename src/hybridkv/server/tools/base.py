"""The tool-call parser interface: the model's text -> content + tool calls, as far as it goes.

A parser reads the *whole* text generated so far (not a delta) and says which part is content
and which calls it holds, each call's name once it is known and its arguments as JSON text so
far. Arguments so far are always a prefix of the arguments at the end (a parser builds them in
the order the model writes them), so a stream sends each call's new suffix
(``stream.py``). With ``final=True`` the text is complete: a parser then returns calls only if
every call is whole and valid, else no call and the whole text as content (vLLM's rule: a
malformed call is the model talking, not calling).

::

    model text:  "Let me check.<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>"
                  |-- content --||------------------ call 0 ----------------------------|
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class ToolCallDraft:
    """One call as far as the text goes: ``name`` None until the model has written it whole;
    ``arguments`` the JSON text of its arguments so far (an object once ``complete``)."""

    name: str | None
    arguments: str
    complete: bool


@dataclass(frozen=True, slots=True)
class ParsedTools:
    """``content``: the text that is not a call (so far: a tail that may start a call is held
    back while ``final`` is False); ``calls`` in the order written."""

    content: str
    calls: list[ToolCallDraft] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What a parser may need of the request's ``tools``: each function's parameter types."""

    parameters: dict[str, dict[str, Any]]  # function name -> its JSON schema's properties

    @staticmethod
    def of(tools: Sequence[dict[str, Any]] | None) -> ToolSpec:
        out: dict[str, dict[str, Any]] = {}
        for tool in tools or ():
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                schema = function.get("parameters")
                props = schema.get("properties") if isinstance(schema, dict) else None
                out[function["name"]] = props if isinstance(props, dict) else {}
        return ToolSpec(out)


class BaseToolParser(ABC):
    """One model family's tool-call format (``--tool-call-parser NAME``)."""

    name: ClassVar[str]
    # the format's markers are special tokens: detokenize with skip_special_tokens=False
    keeps_special_tokens: ClassVar[bool] = False

    def __init__(self, spec: ToolSpec | None = None) -> None:
        self.spec = spec or ToolSpec({})

    @abstractmethod
    def parse(self, text: str, final: bool) -> ParsedTools:
        """Content and calls of ``text`` (everything generated so far; whole if ``final``)."""


def no_calls(text: str) -> ParsedTools:
    return ParsedTools(text, [])


def held_back(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of ``text`` could be the start of one of ``markers``
    (a stream holds them back: they may turn out to be a call)."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def may_start(text: str, markers: Sequence[str]) -> bool:
    """Whether ``text`` (the answer so far) may still grow into one of ``markers``."""
    return any(m.startswith(text) and m != text for m in markers)


def leading(text: str, markers: Sequence[str], final: bool) -> int | None:
    """Where the answer starts (past leading whitespace); None while it may still grow into
    one of ``markers`` (a format whose calls are the whole answer waits until it knows)."""
    i = len(text) - len(text.lstrip())
    return None if not final and may_start(text[i:], markers) else i


def content_before(text: str, at: int, final: bool, markers: Sequence[str]) -> str:
    """The content ``text[:at]`` (``at``: where the first call starts, or len); a stream
    holds back a tail that may start a marker."""
    head = text[:at]
    if final or at < len(text):
        return head
    return head[: len(head) - held_back(head, markers)]


def finished(parsed: ParsedTools, text: str) -> ParsedTools:
    """The final answer: the calls if every one is whole and named, else the text as content."""
    if parsed.calls and all(c.complete and c.name for c in parsed.calls):
        return parsed
    return no_calls(text)

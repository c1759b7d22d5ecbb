"""``openai``: gpt-oss's harmony format. The answer is a run of messages, each a header and a
body; the channel says what a body is (``analysis``: reasoning; ``final``: the answer;
``commentary``: a preamble, or a tool call when the header names a ``functions.*``
recipient)::

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city": "Paris"}<|call|>

The markers are special tokens: parsed with ``skip_special_tokens=False``. ``read_harmony``
is shared with the ``openai_gptoss`` reasoning parser, which passes the calls on in this
form (so the two parsers compose: reasoning first, then calls).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hybridkv.server.tools.base import BaseToolParser, ParsedTools, ToolCallDraft, held_back

MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
HEADS = ("<|start|>", "<|channel|>")
MARKERS = (*ENDS, *HEADS, MESSAGE, "<|constrain|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


@dataclass(frozen=True, slots=True)
class Piece:
    """A run of the answer: plain text (``channel`` None) or one message's body so far."""

    channel: str | None
    function: str | None  # the called function (a ``to=functions.NAME`` recipient)
    body: str
    head: str  # the message's header text (empty for plain text)
    complete: bool

    def as_call_text(self) -> str:
        """The call message again, closed once whole (what the ``openai`` parser reads)."""
        return self.head + MESSAGE + self.body + ("<|call|>" if self.complete else "")


def read_harmony(text: str, final: bool) -> list[Piece]:
    """The pieces of ``text`` in order; a tail that may be a marker is held back unless
    ``final``."""
    pieces: list[Piece] = []
    i = 0
    while i < len(text):
        head = min((j for j in (text.find(h, i) for h in HEADS) if j >= 0), default=-1)
        if head != i:
            plain = text[i : len(text) if head < 0 else head]
            keep = len(plain) if final or head >= 0 else len(plain) - held_back(plain, MARKERS)
            pieces.append(Piece(None, None, plain[:keep], "", True))
            if head < 0:
                break
        at = text.find(MESSAGE, head)
        if at < 0:  # the header is still being written
            if final:
                pieces.append(Piece(None, None, text[head:], "", True))
            break
        header = text[head:at]
        channel = _CHANNEL.search(header)
        function = _RECIPIENT.search(header)
        start = at + len(MESSAGE)
        ends = [(j, m) for j, m in ((text.find(m, start), m) for m in (*ENDS, *HEADS)) if j >= 0]
        end, marker = min(ends) if ends else (-1, "")
        body = text[start:] if end < 0 else text[start:end]
        if end < 0 and not final:
            body = body[: len(body) - held_back(body, MARKERS)]
        pieces.append(Piece(channel.group(1) if channel else "final",
                            function.group(1) if function else None, body, header,
                            end >= 0 or final))  # fmt: skip
        if end < 0:
            break
        i = end + (len(marker) if marker in ENDS else 0)
    return pieces


class HarmonyToolParser(BaseToolParser):
    name = "openai"
    keeps_special_tokens = True

    def parse(self, text: str, final: bool) -> ParsedTools:
        content, calls = [], []
        for piece in read_harmony(text, final):
            if piece.function is not None:
                calls.append(ToolCallDraft(piece.function, piece.body.lstrip(), piece.complete))
            elif piece.channel in (None, "final", "commentary"):
                content.append(piece.body)
        return ParsedTools("".join(content), calls)

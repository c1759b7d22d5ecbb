"""A reasoning parser: the model's text -> (reasoning, content), as far as the text goes.

The reasoning is one section at the start of the answer, between a start and an end marker
(``<think>`` ... ``</think>``). A template may write the start marker into the prompt (Qwen3
thinking models, DeepSeek-R1): then the answer starts inside the section, which the prompt
tells (``starts_inside``). While the text is not ``final``, a tail that may be the start of a
marker is held back (it is sent once it turns out not to be one).

::

    prompt: "...<|im_start|>assistant\\n<think>\\n"   (the answer starts inside)
    answer: "the user wants X</think>\\n\\nX is 4."
             |--- reasoning ---|        |- content -|
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from hybridkv.server.tools.base import held_back, may_start


@dataclass(frozen=True, slots=True)
class Split:
    reasoning: str | None  # None: the answer has no reasoning section
    content: str


class BaseReasoningParser:
    """Markers-based reasoning: subclasses set the markers and whether an answer with no start
    marker is reasoning until the end marker (``always_inside``: DeepSeek-R1)."""

    name: ClassVar[str]
    starts: ClassVar[Sequence[str]]
    ends: ClassVar[Sequence[str]]
    always_inside: ClassVar[bool] = False
    keeps_special_tokens: ClassVar[bool] = False  # markers are special tokens (harmony)

    def __init__(self, prompt: str | None = None) -> None:
        self.prompt_inside = self.always_inside or (prompt is not None and self.opens(prompt))

    def opens(self, prompt: str) -> bool:
        """Whether the prompt ends inside a reasoning section (its last start marker is after
        its last end marker)."""
        last_start = max(prompt.rfind(m) for m in self.starts)
        return last_start >= 0 and last_start > max(prompt.rfind(m) for m in self.ends)

    def split(self, text: str, final: bool) -> Split:
        lead = len(text) - len(text.lstrip())
        rest = text[lead:]
        if not final and may_start(rest, self.starts):
            return Split(None, "")  # maybe a start marker: wait
        start = next((m for m in self.starts if rest.startswith(m)), None)
        if start is None and not self.prompt_inside:
            return Split(None, text)
        at = lead + len(start) if start else 0
        end, marker = _first(text, self.ends, at)
        if end < 0:
            keep = len(text) if final else len(text) - held_back(text[at:], self.ends)
            return Split(text[at:keep], "")
        return Split(text[at:end], text[end + len(marker) :])


def _first(text: str, markers: Sequence[str], at: int) -> tuple[int, str]:
    found = [(text.find(m, at), m) for m in markers]
    hits = [(i, m) for i, m in found if i >= 0]
    return min(hits) if hits else (-1, "")

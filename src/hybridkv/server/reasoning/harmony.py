"""``openai_gptoss``: gpt-oss's harmony ``analysis`` channel is its reasoning
(``tools/harmony.py`` reads the messages). The content is the ``final`` and preamble bodies;
tool-call messages are passed on whole, for ``--tool-call-parser openai``."""

from __future__ import annotations

from hybridkv.server.reasoning.base import BaseReasoningParser, Split
from hybridkv.server.tools.harmony import read_harmony


class HarmonyReasoningParser(BaseReasoningParser):
    name = "openai_gptoss"
    starts = ("<|channel|>analysis",)
    ends = ("<|end|>",)
    keeps_special_tokens = True

    def split(self, text: str, final: bool) -> Split:
        reasoning: list[str] = []
        content: list[str] = []
        for piece in read_harmony(text, final):
            if piece.channel == "analysis":
                reasoning.append(piece.body)
            elif piece.function is not None:
                content.append(piece.as_call_text())
            else:
                content.append(piece.body)
        return Split("".join(reasoning) if reasoning else None, "".join(content))

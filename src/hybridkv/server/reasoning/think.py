"""``<think>`` ... ``</think>`` reasoning: ``qwen3`` (Qwen3, Qwen3-Next, Qwen3.5) and
``deepseek_r1`` (whose answers are reasoning until ``</think>`` even without ``<think>``)."""

from __future__ import annotations

from hybridkv.server.reasoning.base import BaseReasoningParser


class Qwen3ReasoningParser(BaseReasoningParser):
    name = "qwen3"
    starts = ("<think>",)
    ends = ("</think>",)


class DeepSeekR1ReasoningParser(BaseReasoningParser):
    name = "deepseek_r1"
    starts = ("<think>",)
    ends = ("</think>",)
    always_inside = True

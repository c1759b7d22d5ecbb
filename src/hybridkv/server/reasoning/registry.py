"""The reasoning parsers by ``--reasoning-parser`` name, imported on first use."""

from __future__ import annotations

from hybridkv.server.reasoning.base import BaseReasoningParser
from hybridkv.server.tools.registry import load_named

_REASONING_PARSERS = {
    "qwen3": "hybridkv.server.reasoning.think:Qwen3ReasoningParser",
    "deepseek_r1": "hybridkv.server.reasoning.think:DeepSeekR1ReasoningParser",
    "granite": "hybridkv.server.reasoning.granite:GraniteReasoningParser",
    "openai_gptoss": "hybridkv.server.reasoning.harmony:HarmonyReasoningParser",
}


def reasoning_parser_names() -> list[str]:
    return sorted(_REASONING_PARSERS)


def get_reasoning_parser(name: str) -> type[BaseReasoningParser]:
    """The parser class of ``name``; a ValueError naming the known ones if there is none."""
    parser: type[BaseReasoningParser] = load_named(_REASONING_PARSERS, name, "--reasoning-parser")
    return parser

"""The tool-call parsers by ``--tool-call-parser`` name, each module imported on first use
(``hybridkv serve --help`` lists the names without importing any). Adding a format: a
``BaseToolParser`` subclass in its own module and one line here."""

from __future__ import annotations

import importlib
from typing import Any

from hybridkv.server.tools.base import BaseToolParser

_TOOL_PARSERS = {
    "hermes": "hybridkv.server.tools.hermes:HermesToolParser",
    "qwen3_xml": "hybridkv.server.tools.qwen3_xml:Qwen3XmlToolParser",
    "qwen3_coder": "hybridkv.server.tools.qwen3_xml:Qwen3CoderToolParser",
    "granite": "hybridkv.server.tools.granite:GraniteToolParser",
    "llama3_json": "hybridkv.server.tools.llama3_json:Llama3JsonToolParser",
    "openai": "hybridkv.server.tools.harmony:HarmonyToolParser",
}


def tool_parser_names() -> list[str]:
    return sorted(_TOOL_PARSERS)


def get_tool_parser(name: str) -> type[BaseToolParser]:
    """The parser class of ``name``; a ValueError naming the known ones if there is none."""
    parser: type[BaseToolParser] = load_named(_TOOL_PARSERS, name, "--tool-call-parser")
    return parser


def load_named(table: dict[str, str], name: str, flag: str) -> Any:
    """``table[name]`` (a ``module:attr`` string) imported; a ValueError naming ``flag`` and
    the known names if there is none."""
    target = table.get(name)
    if target is None:
        raise ValueError(f"{flag} {name!r} is not known: choose one of {sorted(table)}")
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)

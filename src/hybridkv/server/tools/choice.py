"""``tool_choice`` as vLLM reads it, and the two choices that constrain the output.

| tool_choice              | the output                                   | parsed by               |
|--------------------------|----------------------------------------------|-------------------------|
| ``none``                 | text (the tools still reach the template)    | nothing                 |
| ``auto`` (tools, unset)  | text that may hold calls in the model's form | ``--tool-call-parser``  |
| ``required``             | a JSON list ``[{"name", "parameters"}, ...]``| ``RequiredChoiceParser``|
| ``{"type": "function",`` | the named function's arguments, as JSON      | ``NamedChoiceParser``   |
| ``"function": {"name"}}``|                                              |                         |

The last two are held to a JSON schema by the structured-output backend, so they work on any
model, with or without a parser (vLLM's behaviour).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridkv.server.tools.base import (
    BaseToolParser,
    ParsedTools,
    ToolCallDraft,
    ToolSpec,
    finished,
)
from hybridkv.server.tools.json_calls import read_call_list
from hybridkv.server.tools.json_scan import skip_ws, try_load

AUTO_NEEDS_FLAGS = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)
# between JSON tokens of a constrained call: one space at most (a small model held to any
# whitespace can emit it forever; the parsers read any spacing)
CALL_WHITESPACE = "[ ]?"
NAMED_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


class ToolChoiceError(ValueError):
    """A ``tools`` / ``tool_choice`` combination vLLM refuses (a 400 naming ``param``)."""

    def __init__(self, message: str, param: str = "tool_choice") -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """The request's choice, read: ``mode`` is none / auto / required / named."""

    mode: str
    name: str | None = None  # the named function

    @property
    def constrained(self) -> bool:
        return self.mode in ("required", "named")


def read_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> ToolChoice:
    """vLLM's rules: tools without a choice mean ``auto``; a choice other than ``none``
    needs tools; ``required`` with an empty list is ``none``; a named function must be one
    of the tools."""
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if choice == "none":
        return ToolChoice("none")
    if tools is None:
        raise ToolChoiceError("When using `tool_choice`, `tools` must be set.")
    if choice == "required":
        return ToolChoice("required" if tools else "none")
    if choice == "auto":
        return ToolChoice("auto")
    if not isinstance(choice, dict):
        raise ToolChoiceError(
            f"Invalid value for `tool_choice`: {choice!r}! Only named tools, "
            '"none", "auto" or "required" are supported.'
        )
    function = choice.get("function")
    if not isinstance(function, dict) or "name" not in function:
        raise ToolChoiceError(f"Invalid value for `tool_choice`: {choice!r}! {NAMED_USAGE}")
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise ToolChoiceError(f"Invalid `name` in `tool_choice`: {name!r}! {NAMED_USAGE}")
    if name not in ToolSpec.of(tools).parameters:
        raise ToolChoiceError(
            f"The tool specified in `tool_choice` ({name!r}) does not match any of the "
            "specified `tools`"
        )
    return ToolChoice("named", name)


def choice_schema(
    choice: ToolChoice, tools: list[dict[str, Any]], parallel: bool = True
) -> dict[str, Any]:
    """The JSON schema the output must follow: the named function's parameters, or a
    non-empty list of ``{"name": one of the tools, "parameters": its parameters}`` (of one
    call only with ``parallel_tool_calls=false``)."""
    functions = {t["function"]["name"]: t["function"] for t in tools}
    if choice.mode == "named":
        assert choice.name is not None
        return _parameters(functions[choice.name])
    defs: dict[str, Any] = {}
    options = []
    for name, function in functions.items():
        params = dict(_parameters(function))
        defs.update(params.pop("$defs", None) or {})  # vLLM hoists each tool's $defs
        options.append({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        })  # fmt: skip
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": options}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _parameters(function: dict[str, Any]) -> dict[str, Any]:
    params = function.get("parameters")
    return params if isinstance(params, dict) else {"type": "object", "properties": {}}


class RequiredChoiceParser(BaseToolParser):
    """``tool_choice=required``: the output is the JSON list of calls, nothing else."""

    name = "required"

    def parse(self, text: str, final: bool) -> ParsedTools:
        read = read_call_list(text, skip_ws(text, 0))
        calls = [] if read is None else read[0]
        parsed = ParsedTools("", calls)
        return finished(parsed, text) if final else parsed


class NamedChoiceParser(BaseToolParser):
    """A named function: the whole output is its arguments (vLLM answers the call even if
    the output was cut short)."""

    name = "named"

    def __init__(self, function: str) -> None:
        super().__init__()
        self.function = function

    def parse(self, text: str, final: bool) -> ParsedTools:
        arguments = text.lstrip()
        complete = final and isinstance(try_load(arguments), dict)
        return ParsedTools("", [ToolCallDraft(self.function, arguments, complete or final)])

"""Chat templates as Hugging Face renders them: a sandboxed jinja2 environment with the helpers
HF templates call (``raise_exception``, ``strftime_now``, ``tojson`` without HTML escaping,
``{% generation %}`` blocks, loop controls), ``continue_final_message``, and list-of-parts
message content (text parts joined, as vLLM does).

A template comes from the checkpoint (``chat_template.jinja``, or tokenizer_config.json's
``chat_template``, a string or named templates) or from ``--chat-template`` (a file, or the
template text itself, as vLLM accepts).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

RESERVED_TEMPLATE_VARIABLES = ("messages", "add_generation_prompt", "tools", "documents")


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (bad content, or the template raised)."""


class _GenerationBlocks(Extension):
    """``{% generation %}...{% endgeneration %}`` (HF marks assistant text with it): the body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlocks, "jinja2.ext.loopcontrols"],
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson  # like transformers: no HTML escaping
    return env.from_string(source)


def template_source(value: str) -> str:
    """``--chat-template``: a file's text if ``value`` names a file, else the template itself
    (a value with no jinja markup that is not a file is a missing file: a clear error)."""
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    if "{" not in value:
        raise ValueError(f"--chat-template {value!r}: no such file (nor a jinja template)")
    return value


def checkpoint_template(model_dir: Path, config: dict[str, Any]) -> str | None:
    """The checkpoint's template: chat_template.jinja first, then tokenizer_config.json."""
    source = config.get("chat_template")
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        source = jinja_file.read_text()
    if isinstance(source, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    return source if isinstance(source, str) else None


def text_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates expect them (vLLM's normalisation): list-of-parts content joined
    into one string (text parts, by newlines; any other part is an error naming it), ``None``
    content as ``""`` (an assistant message that only calls tools), each tool call's
    ``arguments`` as a dict (OpenAI sends a JSON string; templates iterate it), and earlier
    reasoning under both ``reasoning`` and ``reasoning_content``."""
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(
                f"messages[{i}] must be an object, got {type(message).__name__}"
            )
        content = message.get("content")
        if isinstance(content, list):
            message = {**message, "content": _join_parts(content, i)}
        elif content is None:
            message = {**message, "content": ""}
        if message.get("tool_calls") is not None:
            message = {**message, "tool_calls": _tool_calls(message["tool_calls"], i)}
        reasoning = message.get("reasoning", message.get("reasoning_content"))
        if isinstance(reasoning, str):
            message = {**message, "reasoning": reasoning, "reasoning_content": reasoning}
        out.append(message)
    return out


def _tool_calls(calls: Any, index: int) -> list[dict[str, Any]]:
    """An assistant message's calls with their ``arguments`` decoded (``{}`` if empty)."""
    where = f"messages[{index}].tool_calls"
    if not isinstance(calls, list):
        raise ChatTemplateError(f"{where} must be a list of calls")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ChatTemplateError(
                f"{where}[{j}] must be {{'type': 'function', 'function': {{'name': ..., "
                "'arguments': ...}}}"
            )
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
                raise ChatTemplateError(
                    f"{where}[{j}].function.arguments is not JSON: {exc}"
                ) from None
        out.append({**call, "function": {**function, "arguments": arguments}})
    return out


def _join_parts(parts: list[Any], index: int) -> str:
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
            continue
        raise ChatTemplateError(
            f"messages[{index}].content[{j}]: content parts of type {kind!r} are not supported "
            "(hybridkv serves text models: only {'type': 'text', 'text': ...} parts)"
        )
    return "\n".join(texts)


def render(
    template: jinja2.Template,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    continue_final_message: bool,
    variables: dict[str, Any],
) -> str:
    """The prompt text; with ``continue_final_message`` it ends inside the last message (HF's
    rule: cut after the last occurrence of its content), so the model continues it."""
    if continue_final_message and add_generation_prompt:
        raise ChatTemplateError(
            "continue_final_message and add_generation_prompt cannot both be true"
        )
    messages = text_messages(messages)
    try:
        text = template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )
    except (jinja2.TemplateError, TypeError) as exc:  # TypeError: e.g. a number + a string
        raise ChatTemplateError(f"the chat template failed: {exc}") from None
    if not continue_final_message:
        return text
    final = messages[-1].get("content") if messages else None
    if not isinstance(final, str) or not final.strip():
        raise ChatTemplateError("continue_final_message needs a last message with text content")
    at = text.rfind(final.strip())
    if at < 0:
        raise ChatTemplateError(
            "continue_final_message: the template changed the last message's text, so where it "
            "ends in the prompt is unknown"
        )
    return text[: at + len(final.strip())]


def _tojson(value: object, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)

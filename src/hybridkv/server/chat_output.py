"""A chat choice's text -> OpenAI's assistant message: reasoning split off, tool calls parsed.

::

    model text ──reasoning parser──> reasoning ("reasoning", "reasoning_content")
                        └──────────> content ──tool parser──> content + tool_calls

``ChatParsers`` is the server's configuration (``--reasoning-parser``, ``--tool-call-parser``,
``--enable-auto-tool-choice``); ``ChatOutputPlan`` is one request's (which parsers apply, given
its ``tool_choice``); ``ChoiceStream`` turns one streamed choice's text deltas into message
deltas. Reasoning is sent under both ``reasoning`` (vLLM's name since 0.11) and
``reasoning_content`` (DeepSeek's, which older vLLM sent and most clients read).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from hybridkv.sampling.params import SamplingParams
from hybridkv.sampling.structured import StructuredOutputsParams
from hybridkv.server.errors import bad_request
from hybridkv.server.protocol import ChatCompletionRequest
from hybridkv.server.reasoning.base import BaseReasoningParser
from hybridkv.server.reasoning.registry import get_reasoning_parser
from hybridkv.server.sampling import check_min_tokens, refuse
from hybridkv.server.tools.base import BaseToolParser, ToolSpec
from hybridkv.server.tools.choice import (
    AUTO_NEEDS_FLAGS,
    CALL_WHITESPACE,
    NamedChoiceParser,
    RequiredChoiceParser,
    ToolChoice,
    ToolChoiceError,
    choice_schema,
    read_tool_choice,
)
from hybridkv.server.tools.registry import get_tool_parser
from hybridkv.server.tools.stream import ToolCallStream, call_entries


@dataclass(frozen=True, slots=True)
class ChatParsers:
    """The server's parsers (checked at start-up: an unknown name is a ValueError)."""

    tool_parser: str | None = None  # --tool-call-parser
    auto_tool_choice: bool = False  # --enable-auto-tool-choice
    reasoning_parser: str | None = None  # --reasoning-parser

    def __post_init__(self) -> None:
        if self.auto_tool_choice and self.tool_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME")
        if self.tool_parser is not None:
            get_tool_parser(self.tool_parser)
        if self.reasoning_parser is not None:
            get_reasoning_parser(self.reasoning_parser)

    @property
    def can_auto(self) -> bool:
        return self.auto_tool_choice and self.tool_parser is not None


@dataclass(frozen=True, slots=True)
class ChatOutputPlan:
    """One request's parsing: none of it for plain chat (the message is the text)."""

    choice: ToolChoice = ToolChoice("none")
    parsers: ChatParsers = ChatParsers()
    tools: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None  # tells whether the answer starts inside a reasoning section
    parallel: bool = True  # parallel_tool_calls

    def reasoning(self) -> BaseReasoningParser | None:
        name = self.parsers.reasoning_parser
        if name is None or self.choice.constrained:  # a constrained answer is all JSON
            return None
        return get_reasoning_parser(name)(self.prompt)

    def tool_parser(self) -> BaseToolParser | None:
        mode = self.choice.mode
        if mode == "required":
            return RequiredChoiceParser()
        if mode == "named":
            assert self.choice.name is not None
            return NamedChoiceParser(self.choice.name)
        if mode == "auto" and self.parsers.tool_parser is not None:
            return get_tool_parser(self.parsers.tool_parser)(ToolSpec.of(list(self.tools)))
        return None

    def message(self, text: str) -> tuple[dict[str, Any], bool]:
        """The whole answer's message, and whether it calls tools."""
        message: dict[str, Any] = {"role": "assistant", "content": text}
        reasoning = self.reasoning()
        if reasoning is not None:
            split = reasoning.split(text, final=True)
            if split.reasoning is not None:
                message.update(reasoning=split.reasoning, reasoning_content=split.reasoning)
                message["content"] = split.content or None
                text = split.content
        parser = self.tool_parser()
        if parser is None or not text:
            return message, False
        parsed = parser.parse(text, final=True)
        if not parsed.calls:  # the text again (harmony: its final channel's bodies)
            message["content"] = parsed.content or None
            return message, False
        message["tool_calls"] = call_entries(parsed, self.parallel)
        message["content"] = parsed.content or (None if self.choice.mode == "auto" else "")
        return message, True

    def finish_reason(self, reason: str | None, called: bool) -> str | None:
        """vLLM's: ``tool_calls`` once auto calls were made, or a required call ended."""
        if called and (
            self.choice.mode == "auto" or reason == "stop" and self.choice.mode == "required"
        ):
            return "tool_calls"
        return reason

    def stream(self) -> ChoiceStream:
        return ChoiceStream(self)


class ChoiceStream:
    """One streamed choice: its text so far and what its deltas have sent."""

    def __init__(self, plan: ChatOutputPlan) -> None:
        self.text = ""
        self.reasoning = plan.reasoning()
        parser = plan.tool_parser()
        self.tools = None if parser is None else ToolCallStream(parser, plan.parallel)
        self.num_reasoning_chars = 0
        self.num_content_chars = 0

    @property
    def called(self) -> bool:
        return self.tools is not None and self.tools.called

    def delta(self, new_text: str, final: bool) -> dict[str, Any]:
        """The delta's fields for ``new_text`` (``final``: the choice's last text)."""
        self.text += new_text
        delta: dict[str, Any] = {}
        content = self.text
        if self.reasoning is not None:
            split = self.reasoning.split(self.text, final)
            new = (split.reasoning or "")[self.num_reasoning_chars :]
            self.num_reasoning_chars += len(new)
            if new:
                delta.update(reasoning=new, reasoning_content=new)
            content = split.content
        if self.tools is not None:
            new, calls = self.tools.take(content, final)
            if calls:
                delta["tool_calls"] = calls
        else:
            new = content[self.num_content_chars :]
            self.num_content_chars += len(new)
        if new:
            delta["content"] = new
        return delta


def plan_chat_output(
    body: ChatCompletionRequest, parsers: ChatParsers, prompt: str
) -> ChatOutputPlan:
    """The request's plan; a 400 for a ``tool_choice`` vLLM refuses (``auto`` needs the
    server's ``--enable-auto-tool-choice --tool-call-parser``)."""
    tools = body.tool_dicts()
    try:
        choice = read_tool_choice(body.tool_choice, tools)
    except ToolChoiceError as exc:
        raise bad_request(str(exc), exc.param) from None
    if choice.mode == "auto" and not parsers.can_auto:
        raise bad_request(AUTO_NEEDS_FLAGS, "tool_choice")
    parallel = body.parallel_tool_calls is not False
    return ChatOutputPlan(choice, parsers, tuple(tools or ()), prompt, parallel)


def constrained_params(
    params: SamplingParams, plan: ChatOutputPlan, body: ChatCompletionRequest
) -> SamplingParams:
    """``params`` with what the plan needs: the JSON schema of a required or named tool
    choice, and special tokens kept when the tool format is written in them."""
    changes: dict[str, Any] = {}
    if plan.choice.constrained:
        refuse(
            params.structured_outputs is not None,
            "tool_choice",
            f"tool_choice={body.tool_choice!r} constrains the output to the tools' JSON schema: "
            "it cannot be combined with response_format or structured_outputs",
        )
        schema = choice_schema(plan.choice, list(plan.tools), plan.parallel)
        changes["structured_outputs"] = StructuredOutputsParams(
            json=schema, whitespace_pattern=CALL_WHITESPACE
        )
    parsers = (plan.tool_parser(), plan.reasoning())
    keeps = any(p is not None and p.keeps_special_tokens for p in parsers)
    if keeps and body.skip_special_tokens is None:
        changes["skip_special_tokens"] = False
    if not changes:
        return params
    try:
        params = dataclasses.replace(params, **changes)
    except ValueError as exc:
        raise bad_request(str(exc), "tools") from None
    check_min_tokens(params)
    return params

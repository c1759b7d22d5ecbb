"""Tool-call and reasoning parsers on text: transcripts in each family's documented format,
whole and streamed in every chunking (the streamed pieces must add up to the whole answer)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hybridkv.server.chat_output import ChatOutputPlan, ChatParsers
from hybridkv.server.tools.base import ToolSpec
from hybridkv.server.tools.choice import ToolChoice
from hybridkv.server.tools.registry import get_tool_parser, tool_parser_names

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "hours": {"type": "array"},
                "ratio": {"type": "number"},
            },
        },
    },
}
TOOLS = (WEATHER, {"type": "function", "function": {"name": "get_time", "parameters": {}}})
PARIS = ("get_weather", {"city": "Paris", "days": 3})
ROME = ("get_weather", {"city": "Rome"})

# (parser, model text, content, calls): written from each format's documentation
TRANSCRIPTS: list[tuple[str, str, str | None, list[tuple[str, dict[str, Any]]]]] = [
    ("hermes", 'I will check.\n<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris", "days": 3}}\n</tool_call>', "I will check.\n", [PARIS]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
               '\n</tool_call>\n<tool_call>\n{"arguments": {"city": "Rome"}, "name": '
               '"get_weather"}\n</tool_call>', None, [PARIS, ROME]),
    ("hermes", '<tool_call>\n{"name": "get_time"}\n</tool_call>', None, [("get_time", {})]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "a}b\\"c"}}',
     None, [("get_weather", {"city": 'a}b"c'})]),  # no closing tag at the very end
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}\n'
               "</tool_call>", None, [ROME]),  # arguments encoded twice (seen from Granite)
    ("hermes", "The answer is 4.", "The answer is 4.", []),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": ', None, []),
    ("qwen3_xml", "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                  "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
     "Let me look.\n", [PARIS]),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n"
                    "</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=hours>\n"
                    "[1, 2]\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n</function>\n"
                    "</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
     None, [("get_weather", {"city": "New\nYork", "metric": True, "hours": [1, 2],
                             "ratio": 0.5}), ("get_time", {})]),
    ("qwen3_xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis", None, []),
    ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", '
                '"days": 3}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]',
     None, [PARIS, ROME]),
    ("granite", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
                "</tool_call>", None, [ROME]),  # Granite 4.0's template: hermes blocks
    ("granite", "Paris is sunny.", "Paris is sunny.", []),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", '
                    '"days": 3}}', None, [PARIS]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
                    '{"name": "get_weather", "parameters": {"city": "Rome"}}', None, [PARIS, ROME]),
    ("llama3_json", "It is {sunny} today.", "It is {sunny} today.", []),
    ("openai", "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
               "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
               '{"city": "Paris", "days": 3}<|call|>', None, [PARIS]),
    ("openai", "<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant to="
               'functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris", '
               '"days": 3}<|call|><|start|>assistant<|channel|>commentary to=functions.'
               'get_weather<|message|>{"city": "Rome"}', "Checking both.", [PARIS, ROME]),
    ("openai", "<|channel|>analysis<|message|>easy<|end|><|start|>assistant<|channel|>final"
               "<|message|>It is 4.", "It is 4.", []),
]  # fmt: skip


def plan(parser: str, reasoning: str | None = None, prompt: str = "") -> ChatOutputPlan:
    parsers = ChatParsers(parser, True, reasoning)
    return ChatOutputPlan(ToolChoice("auto"), parsers, TOOLS, prompt)


def calls_of(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    calls = message.get("tool_calls") or []
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def streamed(p: ChatOutputPlan, text: str, size: int) -> tuple[dict[str, Any], bool]:
    """The message a client rebuilds from the deltas of ``text`` sent ``size`` chars at a time."""
    stream, message = p.stream(), {"content": "", "reasoning": "", "calls": {}}
    pieces = [text[i : i + size] for i in range(0, len(text), size)] or [""]
    for k, piece in enumerate(pieces):
        delta = stream.delta(piece, final=k == len(pieces) - 1)
        message["content"] += delta.get("content", "")
        message["reasoning"] += delta.get("reasoning", "")
        assert delta.get("reasoning") == delta.get("reasoning_content")
        for call in delta.get("tool_calls", []):
            entry = message["calls"].setdefault(call["index"], {"name": None, "arguments": ""})
            if "id" in call:
                assert call["type"] == "function" and entry["name"] is None
                entry["name"] = call["function"]["name"]
            entry["arguments"] += call["function"]["arguments"]
    calls = [message["calls"][i] for i in sorted(message["calls"])]
    message["tool_calls"] = [{"function": c} for c in calls]
    return message, stream.called


@pytest.mark.parametrize(("parser", "text", "content", "calls"), TRANSCRIPTS)
def test_transcript_whole_and_streamed(
    parser: str, text: str, content: str | None, calls: list[Any]
) -> None:
    p = plan(parser)
    message, called = p.message(text)
    assert calls_of(message) == calls and called == bool(calls)
    assert message["content"] == (content if calls or parser == "openai" else text)
    assert p.finish_reason("stop", called) == ("tool_calls" if calls else "stop")
    ids = [c["id"] for c in message.get("tool_calls", [])]
    assert len(set(ids)) == len(ids) and all(i.startswith("chatcmpl-tool-") for i in ids)
    for size in (1, 2, 5, 16, len(text)):
        got, streamed_called = streamed(p, text, size)
        if calls:  # the arguments' text adds up to the whole response's
            assert calls_of(got) == calls and streamed_called
            whole = [c["function"]["arguments"] for c in message["tool_calls"]]
            assert [c["function"]["arguments"] for c in got["tool_calls"]] == whole
            assert got["content"] == (content or "")
        elif not streamed_called:
            assert got["content"] == message["content"]
        else:  # cut inside a call: what was streamed stays, nothing is sent twice
            assert text.startswith(got["content"]) and len(got["tool_calls"]) == 1


def test_every_registered_parser_has_a_transcript() -> None:
    assert set(tool_parser_names()) <= {t[0] for t in TRANSCRIPTS}
    with pytest.raises(ValueError, match="hermes"):
        get_tool_parser("nope")


def test_parallel_tool_calls_false_keeps_the_first() -> None:
    text = TRANSCRIPTS[1][1]
    p = ChatOutputPlan(ToolChoice("auto"), ChatParsers("hermes", True), TOOLS, "", False)
    assert calls_of(p.message(text)[0]) == [PARIS]
    assert calls_of(streamed(p, text, 3)[0]) == [PARIS]


@pytest.mark.parametrize(
    ("value", "schema", "want"),
    [
        ("\n42\n", {"type": "integer"}, 42),
        ("\nforty\n", {"type": "integer"}, "forty"),
        ("\n2.0\n", {"type": "number"}, 2),
        ("\nnan\n", {"type": "number"}, "nan"),
        ("\n1e999\n", {"type": "number"}, "1e999"),
        ("\nfalse\n", {"type": "boolean"}, False),
        ('\n{"a": [1]}\n', {"type": "object"}, {"a": [1]}),
        ("\n{bad\n", {"type": "object"}, "{bad"),
        ("\nnull\n", {"type": "integer"}, None),
        ("\nnull\n", {"type": "string"}, "null"),
        ("\n[1]\n", None, "[1]"),  # no schema: text, as vLLM
    ],
)
def test_qwen3_xml_types_values_by_schema(value: str, schema: Any, want: Any) -> None:
    from hybridkv.server.tools.qwen3_xml import typed_value

    assert typed_value(value, schema) == want


def test_tool_spec_ignores_malformed_tools() -> None:
    spec = ToolSpec.of([{"function": {"name": 3}}, "x", WEATHER])  # type: ignore[list-item]
    assert list(spec.parameters) == ["get_weather"]


# (parser, prompt, model text, reasoning, content)
REASONING = [
    ("qwen3", "<|im_start|>assistant\n", "<think>\nThe user asks.\n</think>\n\nIt is 4.",
     "\nThe user asks.\n", "\n\nIt is 4."),
    ("qwen3", "<|im_start|>assistant\n<think>\n", "add 2 and 2</think>It is 4.",
     "add 2 and 2", "It is 4."),  # the template opened the section
    ("qwen3", "<think>\n\n</think>\n\n", "It is 4.", None, "It is 4."),  # thinking off
    ("qwen3", "", "It is 4.", None, "It is 4."),
    ("qwen3", "", "<think>still thinking", "still thinking", None),  # cut short
    ("deepseek_r1", "", "hmm, 2+2</think>4", "hmm, 2+2", "4"),
    ("deepseek_r1", "", "<think>hmm</think>4", "hmm", "4"),
    ("granite", "", "Here is my thought process: add. Here is my response: 4", " add. ", " 4"),
    ("granite", "", "Here's my thought process:x Here's my response:y", "x ", "y"),
    ("granite", "", "Hello there", None, "Hello there"),
    ("openai_gptoss", "<|start|>assistant", "<|channel|>analysis<|message|>2+2<|end|><|start|>"
     "assistant<|channel|>final<|message|>It is 4.", "2+2", "It is 4."),
]  # fmt: skip


@pytest.mark.parametrize(("parser", "prompt", "text", "reasoning", "content"), REASONING)
def test_reasoning_whole_and_streamed(
    parser: str, prompt: str, text: str, reasoning: str | None, content: str | None
) -> None:
    p = ChatOutputPlan(parsers=ChatParsers(reasoning_parser=parser), prompt=prompt)
    message, _ = p.message(text)
    assert message.get("reasoning_content") == reasoning == message.get("reasoning")
    assert message["content"] == (content if reasoning is not None else text)
    for size in (1, 3, len(text)):
        got, _ = streamed(p, text, size)
        assert (got["reasoning"], got["content"]) == (reasoning or "", content or "")


def test_harmony_reasoning_then_tool_call() -> None:
    text = TRANSCRIPTS[-3][1]  # analysis, then a call
    p = plan("openai", "openai_gptoss")
    message, called = p.message(text)
    assert message["reasoning"] == "Need the weather." and calls_of(message) == [PARIS]
    assert called and message["content"] is None
    for size in (1, 7):
        got, _ = streamed(p, text, size)
        assert got["reasoning"] == "Need the weather." and calls_of(got) == [PARIS]
        assert got["content"] == ""


def test_reasoning_then_tool_call() -> None:
    text = '<think>weather needed</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": ' \
           '{"city": "Rome"}}\n</tool_call>'  # fmt: skip
    p = plan("hermes", "qwen3")
    message, called = p.message(text)
    assert message["reasoning_content"] == "weather needed" and calls_of(message) == [ROME]
    assert message["content"] == "\n\n" and called
    got, _ = streamed(p, text, 4)
    assert got["reasoning"] == "weather needed" and calls_of(got) == [ROME]

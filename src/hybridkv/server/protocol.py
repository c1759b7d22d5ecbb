"""Request bodies of the OpenAI API, as pydantic models (the schema: types and shapes only).

Unknown fields are accepted and ignored, with one warning in the log per request naming them
(vLLM's behaviour: clients send OpenAI fields we do not use, such as ``store`` or
``metadata``); ``ignored_fields`` lists them. A body that breaks the schema answers 400
(``errors.py``). Types are strict (``true`` is not an integer, ``"5"`` is not a number) and
numbers finite (``Infinity``/``NaN``, which Python's JSON parser accepts, are refused). Value
checks (``max_tokens >= 1``, ranges) live in ``SamplingParams``, so the server and the offline
API agree on them. Sampling fields default to ``None`` (unset): the model's
``generation_config.json`` defaults then apply (``params.py``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Prompt = str | list[int]

# extra="allow": unknown fields are kept in ``model_extra`` so the route can name them
STRICT = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
MAX_PROMPTS = 1024  # prompts in one completions request (each is one engine request)


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: accepted, usage comes at the end


class JsonSchema(BaseModel):
    model_config = STRICT

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: ``text``, ``json_object`` or ``json_schema``."""

    model_config = STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class _SamplingFields(BaseModel):
    """Fields both endpoints share (vLLM's names for the extensions)."""

    model_config = STRICT

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    truncate_prompt_tokens: int | None = None
    prompt_logprobs: int | None = None
    return_token_ids: bool | None = None  # vLLM's (>= 0.10): prompt and output token ids
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's: json, regex, choice, grammar...
    user: str | None = None  # cosmetic: accepted and ignored
    cache_salt: str | None = None  # vLLM's: prefix-cache entries only shared per salt
    kv_transfer_params: dict[str, Any] | None = None  # vLLM's P/D handshake data
    # extension: prompt positions to keep state checkpoints at; checked (400) by SamplingParams
    cache_boundaries: Any = None

    @field_validator("stop", "bad_words", mode="before")
    @classmethod
    def _one_string(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def ignored_fields(self) -> list[str]:
        """Names of the body's fields this server does not know (nested ones dotted)."""
        names = sorted(self.model_extra or {})
        if self.stream_options is not None:
            names += [f"stream_options.{k}" for k in sorted(self.stream_options.model_extra or {})]
        return names


class CompletionRequest(_SamplingFields):
    prompt: Any = Field(description="a string, token ids, or a list of either")
    logprobs: int | None = None
    echo: bool = False
    add_special_tokens: bool = True  # vLLM's: the tokenizer's BOS etc. on top of the prompt
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_shape(cls, value: Any) -> list[Prompt]:
        return check_prompt_shape(value)


def check_prompt_shape(value: Any) -> list[Prompt]:
    """A string, a token-id list, or a non-empty list of those: always a list of prompts."""
    if isinstance(value, str) or _is_token_ids(value):
        return [_as_prompt(value)]
    if isinstance(value, list) and value and all(isinstance(p, str | list) for p in value):
        if len(value) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request, got {len(value)}")
        if all(isinstance(p, str) or _is_token_ids(p) for p in value):
            return [_as_prompt(p) for p in value]
    raise ValueError(
        "must be a string, a non-empty list of token ids, or a non-empty list of those"
    )


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(t) for t in value)


def _as_prompt(value: Any) -> Prompt:
    return value if isinstance(value, str) else [int(t) for t in value]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ChatMessage(BaseModel):
    # other fields are passed to the template as given
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # assistant: checked by template_messages
    tool_call_id: str | None = None  # tool: the call this message answers
    reasoning: str | None = None  # assistant: vLLM's name for earlier reasoning
    reasoning_content: str | None = None  # the same, as older vLLM and most clients name it

    def as_template_input(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class FunctionDefinition(BaseModel):
    model_config = STRICT

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolParam(BaseModel):
    """One of ``tools``: ``{"type": "function", "function": {"name", "description",
    "parameters"}}`` (OpenAI's only kind)."""

    model_config = STRICT

    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True  # vLLM's
    add_special_tokens: bool = False  # vLLM's: the template writes them already
    continue_final_message: bool = False  # vLLM's
    chat_template: str | None = None  # vLLM's: a template for this request only
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: extra template variables
    tools: list[ToolParam] | None = None
    tool_choice: str | dict[str, Any] | None = None  # read by tools/choice.py (vLLM's rules)
    parallel_tool_calls: bool | None = None  # false: the first call only
    documents: list[dict[str, Any]] | None = None  # vLLM's: RAG templates

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """``tools`` as the template and the parsers read them (plain dicts, as sent)."""
        if self.tools is None:
            return None
        return [t.model_dump(exclude_unset=True) for t in self.tools]

"""Request bodies of the OpenAI API, as pydantic models (the schema: types and shapes only).

Unknown fields are rejected (422 naming them) rather than silently ignored; fields OpenAI has
but we cannot honour are declared here and refused with a 400 in ``params.py`` unless they hold
their no-op value. Types are strict (``true`` is not an integer, ``"5"`` is not a number) and
numbers finite (``Infinity``/``NaN``, which Python's JSON parser accepts, are refused). Value checks (``max_tokens >= 1``, ranges) live in ``SamplingParams``, so
the server and the offline API agree on them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Prompt = str | list[int]


STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class _SamplingFields(BaseModel):
    """Fields both endpoints share."""

    model_config = STRICT

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension (vLLM's name)
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None  # extension
    ignore_eos: bool = False  # extension
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None  # cosmetic: accepted and ignored
    cache_salt: str | None = None  # extension (vLLM's): prefix-cache entries only shared per salt
    kv_transfer_params: dict[str, Any] | None = None  # extension (vLLM's P/D handshake data)
    # extension: prompt positions to keep state checkpoints at; checked (400) by SamplingParams
    cache_boundaries: Any = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class CompletionRequest(_SamplingFields):
    prompt: Any = Field(description="a string or a list of token ids")
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Prompt:
        return check_prompt_shape(value)


def check_prompt_shape(value: Any) -> Prompt:
    """A string, a token-id list, or a list holding exactly one of those."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one (what lm-eval and others send)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(_is_int(t) for t in value):
        return [int(t) for t in value]
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, str | list) for p in value):
        raise ValueError(
            f"a batch of {len(value)} prompts is not supported: send one prompt per request"
        )
    raise ValueError("must be a string or a non-empty list of token ids")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # name, tool_call_id...: passed to the template
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    role: str
    content: str | list[TextPart] | None = None

    def as_template_input(self) -> dict[str, Any]:
        data = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            data["content"] = "".join(p.text for p in self.content)
        return data


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True  # extension (vLLM's name)

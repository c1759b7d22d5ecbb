"""Prompt shapes of the offline API, under vLLM's names (``vllm.inputs``): a ``TextPrompt`` is
tokenized by the engine, a ``TokensPrompt`` is used as given."""

from __future__ import annotations

from typing import Any, Required, TypedDict


class TextPrompt(TypedDict, total=False):
    prompt: Required[str]
    cache_salt: str  # prefix-cache entries are shared only between prompts with the same salt
    multi_modal_data: Any  # refused: hybridkv runs the text model of multimodal checkpoints


class TokensPrompt(TypedDict, total=False):
    prompt_token_ids: Required[list[int]]
    prompt: str  # the text, if known (shown in outputs)
    cache_salt: str
    multi_modal_data: Any


PromptType = str | list[int] | TextPrompt | TokensPrompt

__all__ = ["PromptType", "TextPrompt", "TokensPrompt"]

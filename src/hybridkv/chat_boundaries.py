"""Where each chat message ends in the rendered prompt: state checkpoint boundaries.

A later conversation with the same system prompt or the same earlier turns shares the
prompt's tokens up to one of these ends, so a state hybrid keeps a checkpoint there (the KV
core rounds each position down to the block). A message's end is where the tokens of the
template rendered for ``messages[:k]`` (without the generation prompt) stop agreeing with the
full prompt's tokens; a template that cannot render a prefix (one that insists on a user
message last, say) just gives no boundary for it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from hybridkv.sampling.params import MAX_CACHE_BOUNDARIES, SamplingParams

MAX_MESSAGES = 64  # a longer conversation: boundaries at its last MAX_MESSAGES message ends


class ChatTokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> Any: ...


def message_boundaries(
    tokenizer: ChatTokenizer,
    messages: list[dict[str, Any]],
    prompt_ids: list[int],
    add_special_tokens: bool = True,
    **template_kwargs: Any,
) -> list[int]:
    """Token positions in ``prompt_ids`` where each message of ``messages`` ends (ascending,
    > 0, duplicates removed). Render and encode as the prompt was (``add_special_tokens``,
    the template's ``tools`` / ``chat_template_kwargs``...), or nothing will agree."""
    found: set[int] = set()
    for k in range(max(1, len(messages) - MAX_MESSAGES + 1), len(messages) + 1):
        try:
            text = tokenizer.apply_chat_template(messages[:k], False, **template_kwargs)
            ids = tokenizer.encode(str(text), add_special_tokens=add_special_tokens)
        except Exception:  # noqa: BLE001 - any template error: no boundary for this prefix
            continue
        n = _common_prefix(ids, prompt_ids)
        if n > 0:
            found.add(n)
    return sorted(found)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def with_cache_boundaries(params: SamplingParams, boundaries: list[int]) -> SamplingParams:
    """``params`` with ``boundaries`` added to ``extra_args["cache_boundaries"]``."""
    if not boundaries:
        return params
    extra = dict(params.extra_args or {})
    merged = sorted(set(params.cache_boundaries) | set(boundaries))
    extra["cache_boundaries"] = merged[-MAX_CACHE_BOUNDARIES:]
    return dataclasses.replace(params, extra_args=extra)

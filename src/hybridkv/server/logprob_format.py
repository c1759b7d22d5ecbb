"""Log-probabilities in OpenAI's two shapes, from the engine's vLLM-shaped ones.

The engine gives, per token, ``{token_id: Logprob(logprob, rank, decoded_token)}`` holding the
chosen token and the top k (``CompletionOutput.logprobs``; ``RequestOutput.prompt_logprobs``
has ``None`` for the first prompt token, which nothing predicts). Completions show each
token's text, log-probability and a ``{text: logprob}`` map of the chosen token plus the top k
(vLLM's); chat shows the top k as a list. ``-inf`` is sent as -9999.0 (OpenAI's value: JSON
has no infinity).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_LOGPROB = -9999.0
Decode = Callable[[int], str]


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """A run of tokens: text, log-probability (None: the first prompt token), and the top
    alternatives as ``(text, logprob)`` best first (None where there is no entry)."""

    tokens: list[str]
    logprobs: list[float | None]
    top: list[list[tuple[str, float]] | None]
    chosen: list[tuple[str, float] | None]
    text_offset: int  # characters of text before the first of them


def collect(
    ids: Sequence[int],
    entries: Sequence[dict[int, Any] | None],
    k: int,
    decode: Decode,
    text_offset: int,
) -> TokenLogprobs:
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[list[tuple[str, float]] | None] = []
    chosen: list[tuple[str, float] | None] = []
    for token_id, entry in zip(ids, entries, strict=True):
        if entry is None or token_id not in entry:
            tokens.append(decode(token_id))
            values.append(None)
            tops.append(None)
            chosen.append(None)
            continue
        text = _text(token_id, entry[token_id], decode)
        value = _clip(entry[token_id].logprob)
        tokens.append(text)
        values.append(value)
        chosen.append((text, value))
        tops.append(_top(entry, k, decode))
    return TokenLogprobs(tokens, values, tops, chosen, text_offset)


def completion_logprobs(lp: TokenLogprobs | None) -> dict[str, Any] | None:
    if lp is None:
        return None
    offsets, at = [], lp.text_offset
    for token in lp.tokens:
        offsets.append(at)
        at += len(token)
    top: list[dict[str, float] | None] = []
    for chosen, alternatives in zip(lp.chosen, lp.top, strict=True):
        if chosen is None or alternatives is None:
            top.append(None)
        else:
            top.append(dict([chosen, *alternatives]))
    return {
        "tokens": lp.tokens,
        "token_logprobs": lp.logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    }


def chat_logprobs(lp: TokenLogprobs | None) -> dict[str, Any] | None:
    if lp is None:
        return None
    content = []
    for token, value, top in zip(lp.tokens, lp.logprobs, lp.top, strict=True):
        alternatives = [
            {"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in (top or [])
        ]
        content.append(
            {
                "token": token,
                "logprob": MIN_LOGPROB if value is None else value,
                "bytes": list(token.encode()),
                "top_logprobs": alternatives,
            }
        )
    return {"content": content}


def vllm_logprobs(entry: dict[int, Any] | None, decode: Decode) -> dict[str, Any] | None:
    """One position in vLLM's own shape (its ``prompt_logprobs``): the chosen token and the
    top k as ``{"<token id>": {"logprob", "rank", "decoded_token"}}``."""
    if entry is None:
        return None
    return {
        str(token_id): {
            "logprob": _clip(lp.logprob),
            "rank": getattr(lp, "rank", None),
            "decoded_token": _text(token_id, lp, decode),
        }
        for token_id, lp in entry.items()
    }


def _top(entry: dict[int, Any], k: int, decode: Decode) -> list[tuple[str, float]]:
    """The k best entries by rank (the chosen token is in the dict even when it ranks lower)."""
    if k == 0:
        return []
    ranked = sorted(entry.items(), key=lambda item: _rank(item[1]))
    if k > 0:
        ranked = ranked[:k]
    return [(_text(token_id, lp, decode), _clip(lp.logprob)) for token_id, lp in ranked]


def _rank(lp: Any) -> float:
    rank = getattr(lp, "rank", None)
    return float("inf") if rank is None else float(rank)


def _text(token_id: int, lp: Any, decode: Decode) -> str:
    text = getattr(lp, "decoded_token", None)
    return text if isinstance(text, str) else decode(token_id)


def _clip(value: float) -> float:
    return max(float(value), MIN_LOGPROB)

"""What the engine does to a request's parameters and prompt before queueing it: ids checked
against the vocabulary, bad words tokenized (vLLM's rule), the structured-output constraint
compiled (so a bad grammar fails at add), the prompt truncated (``truncate_prompt_tokens``) and
its ids checked (in the vocabulary, no placeholder only a vision tower could fill)."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from hybridkv.sampling.grammar import GrammarBackend
from hybridkv.sampling.params import SamplingParams


class Encoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


def prepare_params(
    params: SamplingParams, encoder: Encoder, vocab_size: int, grammar: GrammarBackend
) -> SamplingParams:
    """``params`` checked and completed for this model (ValueError naming the field)."""
    params.check_vocab(vocab_size)
    if params.structured_outputs is not None:
        grammar.compile(params.structured_outputs)  # cached: the runner's copy is cheap
    if params.bad_words and params.bad_words_token_ids is None:
        ids = bad_words_token_ids(params.bad_words, encoder)
        bad = [t for word in ids for t in word if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"invalid sampling parameter bad_words: token ids {bad[:5]} "
                             f"outside the vocabulary [0, {vocab_size})")  # fmt: skip
        params = dataclasses.replace(params, bad_words_token_ids=ids)
    return params


def bad_words_token_ids(words: tuple[str, ...], encoder: Encoder) -> tuple[tuple[int, ...], ...]:
    """Each word's token ids as written, and after a space where that is another token
    sequence of the same length starting with another token (vLLM's rule)."""
    out: list[tuple[int, ...]] = []
    for word in words:
        plain = tuple(encoder.encode(word.lstrip(), add_special_tokens=False))
        if plain:
            out.append(plain)
        spaced = tuple(encoder.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and plain and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return tuple(out)


def truncate_prompt(ids: list[int], params: SamplingParams, max_model_len: int) -> list[int]:
    """Keep the last ``truncate_prompt_tokens`` tokens (-1: the model's limit), as vLLM."""
    keep = params.truncate_prompt_tokens
    if keep is None:
        return ids
    if keep == -1:
        keep = max_model_len
    return ids[-keep:] if len(ids) > keep else ids


def check_prompt_ids(
    request_id: str, ids: list[int], vocab_size: int, media_ids: frozenset[int], architecture: str
) -> None:
    """ValueError naming the request unless every prompt id is in the vocabulary and none is an
    image/video placeholder (``media_ids``: hybridkv runs the text model only)."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(
            f"request {request_id}: token ids {bad[:5]} outside the vocabulary [0, {vocab_size})"
        )
    media = media_ids.intersection(ids)
    if media:
        raise ValueError(
            f"request {request_id}: prompt holds image/video placeholder ids {sorted(media)}; "
            f"hybridkv runs only the text model of {architecture}"
        )

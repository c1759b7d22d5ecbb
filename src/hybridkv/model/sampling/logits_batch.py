"""The step's logits processing for the whole batch: per-step tensors built from the rows'
options and states, each option applied once to the rows that set it (``logits_process``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hybridkv.model.sampling import logits_process as lp
from hybridkv.model.sampling.sampling_state import RequestSamplingState
from hybridkv.sampling.params import SamplingParams

if TYPE_CHECKING:
    from hybridkv.sampling.grammar import GrammarBackend


@dataclass(frozen=True, slots=True)
class ProcessRow:
    """One batch row that needs processing: its options, state, and tokens so far."""

    row: int
    params: SamplingParams
    state: RequestSamplingState
    history: Sequence[int]
    num_prompt_tokens: int
    num_output_tokens: int


def process_logits(
    logits: torch.Tensor,
    rows: list[ProcessRow],
    eos_token_ids: tuple[int, ...],
    grammar: GrammarBackend | None,
) -> torch.Tensor:
    """A processed copy of ``logits [S, V]`` (rows not in ``rows`` unchanged)."""
    out = logits.clone()
    _grammar_mask(out, rows, grammar)
    allowed = [r for r in rows if r.state.allowed_ids is not None]
    if allowed:
        mask = torch.zeros(len(allowed), logits.shape[-1], dtype=torch.bool)
        for i, r in enumerate(allowed):
            assert r.state.allowed_ids is not None
            mask[i, r.state.allowed_ids] = True
        _update(out, allowed, lambda x: lp.apply_allowed(x, mask))
    _ban(out, rows, eos_token_ids)
    _bias(out, rows)
    penalised = [r for r in rows if r.state.counts is not None]
    if penalised:
        _penalise(out, penalised)
    return out


def _update(
    out: torch.Tensor, rows: list[ProcessRow], fn: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    index = torch.tensor([r.row for r in rows], dtype=torch.long)
    out[index] = fn(out[index])


def _grammar_mask(
    out: torch.Tensor, rows: list[ProcessRow], grammar: GrammarBackend | None
) -> None:
    constrained = [r for r in rows if r.state.matcher is not None]
    if not constrained:
        return
    assert grammar is not None
    bitmask = grammar.fill_bitmask([r.state.matcher for r in constrained])
    _update(out, constrained, lambda x: lp.apply_token_bitmask(x, bitmask))


def _ban(out: torch.Tensor, rows: list[ProcessRow], eos_token_ids: tuple[int, ...]) -> None:
    """min_tokens (stop tokens and eos masked until then) and bad words, as one index_put."""
    ban_rows: list[int] = []
    ban_ids: list[int] = []
    for r in rows:
        ids: list[int] = []
        if r.num_output_tokens < r.params.min_tokens:
            ids += r.params.stop_token_ids
            if not r.params.ignore_eos:
                ids += eos_token_ids
        if r.state.bad_words:
            ids += r.state.banned_bad_words(r.history, r.num_prompt_tokens, r.num_output_tokens)
        ban_rows += [r.row] * len(ids)
        ban_ids += ids
    if ban_ids:
        out[:] = lp.apply_ban(out, torch.tensor(ban_rows), torch.tensor(ban_ids))


def _bias(out: torch.Tensor, rows: list[ProcessRow]) -> None:
    biased = [r for r in rows if r.state.bias_ids.numel()]
    if not biased:
        return
    index = torch.cat([torch.full_like(r.state.bias_ids, r.row) for r in biased])
    ids = torch.cat([r.state.bias_ids for r in biased])
    values = torch.cat([r.state.bias_values for r in biased])
    out[:] = lp.apply_bias(out, index, ids, values)


def _penalise(out: torch.Tensor, rows: list[ProcessRow]) -> None:
    vocab = out.shape[-1]
    no_prompt = torch.zeros(vocab, dtype=torch.bool)
    counts = torch.stack([r.state.counts for r in rows if r.state.counts is not None])
    prompt = torch.stack([r.state.prompt_mask if r.state.prompt_mask is not None else no_prompt
                          for r in rows])  # fmt: skip

    def per_row(name: str) -> torch.Tensor:
        return torch.tensor([getattr(r.params, name) for r in rows], dtype=torch.float32)

    rep, freq, pres = (per_row(n) for n in ("repetition_penalty", "frequency_penalty",
                                            "presence_penalty"))  # fmt: skip
    _update(out, rows, lambda x: lp.apply_penalties(x, counts, prompt, rep, freq, pres))

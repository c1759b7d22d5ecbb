"""``LLM.beam_search``: vLLM's beam search (``BeamSearchParams`` in, ``BeamSearchOutput`` out),
built on ``LLM.generate`` as vLLM builds it.

Each round asks the engine for one token of every live beam with ``2 * beam_width``
alternatives (their logprobs); every (beam, alternative) pair is a candidate; a candidate ending
in EOS is complete, the ``beam_width`` best others live on. After ``max_tokens`` rounds the
live beams join the complete ones and the ``beam_width`` best are returned, best first.
A beam's score is ``cum_logprob / len(tokens) ** length_penalty`` (prompt included, a final EOS
not), as vLLM's. The rounds cost little beyond the new tokens: each beam's prompt is the
previous round's prompt plus one token, so it hits the prefix cache (and, for hybrid models,
the state checkpoint taken at its prompt's last block boundary).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridkv.sampling.logprobs import TokenLogprobs
from hybridkv.sampling.params import SamplingParams


@dataclass(frozen=True, slots=True)
class BeamSearchParams:
    """vLLM's ``BeamSearchParams``; checked when made (a bad one raises ``ValueError``)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BeamSearchParams.{name}={value!r}: must be an integer >= 1")
        for name in ("temperature", "length_penalty"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"BeamSearchParams.{name}={value!r}: must be a finite number")
        if self.temperature < 0:
            raise ValueError(f"BeamSearchParams.temperature={self.temperature}: must be >= 0")


@dataclass(slots=True)
class BeamSearchSequence:
    """One beam: ``tokens`` is the prompt then the generated tokens (vLLM's); ``text`` the
    generated text (EOS left out unless ``include_stop_str_in_output``)."""

    tokens: list[int]
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # per generated token
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # stop (EOS) | length
    stop_reason: int | str | None = None


@dataclass(slots=True)
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first, at most beam_width


def beam_search(
    llm: Any, prompts: Sequence[list[int]], params: BeamSearchParams
) -> list[BeamSearchOutput]:
    """Beam search from each prompt's token ids (``llm``: an ``LLM``)."""
    need = 2 * params.beam_width
    if need > llm.frontend.options.max_logprobs:
        raise ValueError(
            f"beam_width={params.beam_width} needs {need} logprobs per step: create the LLM "
            f"with max_logprobs >= {need}"
        )
    eos = llm.get_tokenizer().eos_token_id
    score = _scorer(eos, params)
    live = [[BeamSearchSequence(list(ids))] for ids in prompts]
    done: list[list[BeamSearchSequence]] = [[] for _ in prompts]
    step = SamplingParams(max_tokens=1, temperature=params.temperature, logprobs=need)
    max_len = llm.engine.max_model_len
    for _ in range(params.max_tokens):
        for i, beams in enumerate(live):
            done[i] += [b for b in beams if len(b.tokens) >= max_len]  # no room for a token
            live[i] = [b for b in beams if len(b.tokens) < max_len]
        flat = [b for beams in live for b in beams]
        if not flat:
            break
        outputs = iter(llm.generate([{"prompt_token_ids": b.tokens} for b in flat], step,
                                    use_tqdm=False))  # fmt: skip
        for i, beams in enumerate(live):
            grown = [c for b in beams for c in _candidates(b, next(outputs), eos, params, done[i])]
            live[i] = sorted(grown, key=score, reverse=True)[: params.beam_width]
    tokenizer = llm.get_tokenizer()
    return [
        _best(beams + finished, len(ids), score, tokenizer, eos, params)
        for beams, finished, ids in zip(live, done, prompts, strict=True)
    ]


def _candidates(
    beam: BeamSearchSequence, out: Any, eos: int | None, params: BeamSearchParams,
    done: list[BeamSearchSequence],
) -> list[BeamSearchSequence]:  # fmt: skip
    """Every one-token extension of ``beam``; those ending in EOS go to ``done``."""
    if out.error:
        raise ValueError(f"beam search: {out.error}")
    alternatives: TokenLogprobs = out.outputs[0].logprobs[0]
    grown = []
    for token_id, lp in alternatives.items():
        new = BeamSearchSequence(beam.tokens + [token_id], beam.logprobs + [alternatives],
                                 beam.cum_logprob + lp.logprob)  # fmt: skip
        if token_id == eos and not params.ignore_eos:
            done.append(new)
        else:
            grown.append(new)
    return grown


def _scorer(eos: int | None, params: BeamSearchParams) -> Callable[[BeamSearchSequence], float]:
    def score(beam: BeamSearchSequence) -> float:
        length = float(len(beam.tokens) - (beam.tokens[-1] == eos))
        return beam.cum_logprob / math.pow(length, params.length_penalty)

    return score


def _best(
    beams: list[BeamSearchSequence], num_prompt: int, score: Callable[..., float],
    tokenizer: Any, eos: int | None, params: BeamSearchParams,
) -> BeamSearchOutput:  # fmt: skip
    best = sorted(beams, key=score, reverse=True)[: params.beam_width]
    for beam in best:
        stopped = len(beam.tokens) > num_prompt and beam.tokens[-1] == eos
        stopped = stopped and not params.ignore_eos
        keep = len(beam.tokens) - (stopped and not params.include_stop_str_in_output)
        beam.text = tokenizer.decode(beam.tokens[num_prompt:keep])
        beam.finish_reason = "stop" if stopped else "length"
        beam.stop_reason = eos if stopped else None
    return BeamSearchOutput(best)

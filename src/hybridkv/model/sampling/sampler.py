"""Batched token sampling: logits processors, greedy, temperature, min-p, top-k, top-p, seeds.

Sampling uses the exponential race (``argmax(p / E)`` with ``E ~ Exp(1)``), which draws from
``p`` exactly and needs one noise row per request. A seeded request's noise comes from its own
``torch.Generator``, reseeded every step from ``(seed, num_output_tokens)``: the same request
gives the same tokens whatever else is in the batch, and again after a preemption.

Requests with penalties, logit_bias, allowed_token_ids, bad_words, min_tokens or structured
outputs keep a ``RequestSamplingState`` here and go through ``process_logits``; a batch
without them takes the fast path (no copy of the logits). Logprobs are of the raw logits
(vLLM's default ``raw_logprobs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from hybridkv.model.sampling import logits_process as lp
from hybridkv.model.sampling.logits_batch import ProcessRow, process_logits
from hybridkv.model.sampling.logprobs_compute import position_logprobs
from hybridkv.model.sampling.sampling_state import RequestSamplingState
from hybridkv.sampling.params import SamplingParams
from hybridkv.step_io import PositionLogprobs

if TYPE_CHECKING:
    from hybridkv.sampling.grammar import GrammarBackend

_SEED_MIX = 0x9E3779B97F4A7C15


@dataclass(frozen=True, slots=True)
class SampleRequest:
    request_id: str
    params: SamplingParams
    num_output_tokens: int
    history: Sequence[int] = ()  # prompt + output tokens (read by the logits processors)
    num_prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class SampleResult:
    """``invalid_rows``: rows whose logits hold NaN or +inf (or only -inf): nothing can be
    sampled from them; their token and log-probability are meaningless. ``errors``: rows the
    request's own options left without a token (every token masked, a grammar error)."""

    token_ids: list[int]
    logprobs: list[PositionLogprobs | None]
    invalid_rows: list[int]
    errors: dict[int, str] = field(default_factory=dict)


class Sampler:
    """Unseeded requests draw from the sampler's own generator (seeded with the engine seed),
    never from torch's process-wide one."""

    def __init__(
        self,
        seed: int = 0,
        *,
        eos_token_ids: tuple[int, ...] = (),
        grammar: GrammarBackend | None = None,
    ) -> None:
        self._generators: dict[str, torch.Generator] = {}
        self._default = torch.Generator().manual_seed(seed)
        self._states: dict[str, RequestSamplingState] = {}
        self.eos_token_ids = eos_token_ids
        self.grammar = grammar

    def drop(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._generators.pop(request_id, None)
            self._states.pop(request_id, None)

    def sample(self, logits: torch.Tensor, reqs: list[SampleRequest]) -> SampleResult:
        """``logits [S, V]`` float32, one row per request in ``reqs``."""
        fast = self._sample_greedy(logits, reqs)
        if fast is not None:
            return fast
        invalid = invalid_logit_rows(logits)
        if invalid:
            logits = logits.clone()
            logits[invalid] = 0.0  # sample something harmless; the caller fails these rows
        errors: dict[int, str] = {}
        processed = logits
        if any(r.params.needs_processing for r in reqs):
            processed = self._process(logits, reqs, errors)
        chosen = self._choose(processed, reqs)
        return SampleResult(chosen.tolist(), self._logprobs(logits, chosen, reqs), invalid, errors)

    def _sample_greedy(
        self, logits: torch.Tensor, reqs: list[SampleRequest]
    ) -> SampleResult | None:
        """A batch of plain greedy requests (no processors, no logprobs): one argmax pass
        gives both the tokens and the validity check (numpy's argmax picks a row's first NaN
        or its first maximum, so the picked logit is finite exactly when the row holds no NaN
        or +inf and not only -inf; ties go to the first index, as torch's). In numpy: a
        quarter of torch's per-call cost at these sizes. None: take the general path."""
        for r in reqs:
            p = r.params
            if p.temperature != 0.0 or p.logprobs is not None or p.needs_processing:
                return None
        if logits.dtype != torch.float32 or logits.dim() != 2 or logits.requires_grad:
            return None
        host = logits.numpy()
        chosen = host.argmax(axis=1)
        if not np.isfinite(host[np.arange(host.shape[0]), chosen]).all():
            return None  # the general path names the invalid rows
        return SampleResult(chosen.tolist(), [None] * len(reqs), [])

    def _choose(self, logits: torch.Tensor, reqs: list[SampleRequest]) -> torch.Tensor:
        temps = torch.tensor([r.params.temperature for r in reqs], dtype=torch.float32)
        greedy = temps == 0.0  # [S]
        chosen = logits.argmax(dim=-1)  # [S]
        if not bool(greedy.all()):
            random_rows = torch.nonzero(~greedy).flatten()
            sub = [reqs[i] for i in random_rows.tolist()]
            chosen[random_rows] = self._sample_random(logits[random_rows], temps[random_rows], sub)
        return chosen

    def _process(
        self, logits: torch.Tensor, reqs: list[SampleRequest], errors: dict[int, str]
    ) -> torch.Tensor:
        rows = []
        for i, r in enumerate(reqs):
            if not r.params.needs_processing:
                continue
            state = self._state(r, logits.shape[-1])
            state.sync(r.history, r.num_prompt_tokens, r.num_output_tokens)
            if state.error is not None:
                errors[i] = state.error
                continue
            rows.append(ProcessRow(i, r.params, state, r.history, r.num_prompt_tokens,
                                   r.num_output_tokens))  # fmt: skip
        out = process_logits(logits, rows, self.eos_token_ids, self.grammar)
        blocked = torch.isneginf(out).all(dim=-1)
        for i in torch.nonzero(blocked).flatten().tolist():
            errors.setdefault(int(i), "the request's options (allowed_token_ids, bad_words, "
                              "structured outputs, min_tokens) leave no token to sample")  # fmt: skip
            out[i] = 0.0
        return out

    def _state(self, req: SampleRequest, vocab_size: int) -> RequestSamplingState:
        state = self._states.get(req.request_id)
        if state is None:
            so = req.params.structured_outputs
            if so is not None and self.grammar is None:
                raise RuntimeError("structured outputs need the runner's grammar backend")
            matcher = self.grammar.compile(so) if so is not None and self.grammar else None
            state = self._states[req.request_id] = RequestSamplingState(
                req.params, vocab_size, matcher
            )
        return state

    def _logprobs(
        self, logits: torch.Tensor, chosen: torch.Tensor, reqs: list[SampleRequest]
    ) -> list[PositionLogprobs | None]:
        out: list[PositionLogprobs | None] = [None] * len(reqs)
        want = [i for i, r in enumerate(reqs) if r.params.logprobs is not None]
        if want:
            rows = torch.tensor(want, dtype=torch.long)
            ks = [int(reqs[i].params.logprobs or 0) for i in want]
            for i, entry in zip(
                want, position_logprobs(logits[rows], chosen[rows], ks), strict=True
            ):
                out[i] = entry
        return out

    def _sample_random(
        self, logits: torch.Tensor, temps: torch.Tensor, reqs: list[SampleRequest]
    ) -> torch.Tensor:
        scaled = logits / temps[:, None]  # [S, V]
        min_ps = [r.params.min_p for r in reqs]
        if any(min_ps):
            scaled = lp.apply_min_p(scaled, torch.tensor(min_ps, dtype=torch.float32))
        scaled = lp.apply_top_k(scaled, [r.params.top_k for r in reqs])
        scaled = lp.apply_top_p(scaled, [r.params.top_p for r in reqs])
        probs = torch.softmax(scaled, dim=-1)  # [S, V]
        noise = torch.empty_like(probs).exponential_(generator=self._default)  # [S, V]
        for row, req in enumerate(reqs):
            if req.params.seed is not None:
                noise[row].exponential_(generator=self._generator(req))
        return (probs / noise).argmax(dim=-1)

    def _generator(self, req: SampleRequest) -> torch.Generator:
        gen = self._generators.get(req.request_id)
        if gen is None:
            gen = self._generators[req.request_id] = torch.Generator()
        assert req.params.seed is not None
        gen.manual_seed((req.params.seed * _SEED_MIX + req.num_output_tokens) % (1 << 63))
        return gen


def invalid_logit_rows(logits: torch.Tensor) -> list[int]:
    """Rows of ``logits [S, V]`` with a NaN or +inf, or nothing above -inf (a forged KV unit
    or a numerically broken model gives them); one pass over the batch's logits."""
    bad = torch.isnan(logits).any(dim=-1) | torch.isposinf(logits).any(dim=-1)  # [S]
    bad |= torch.isneginf(logits).all(dim=-1)
    return [int(i) for i in torch.nonzero(bad).flatten().tolist()]

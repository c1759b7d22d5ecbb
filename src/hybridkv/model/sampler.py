"""Batched token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Sampling uses the exponential race (``argmax(p / E)`` with ``E ~ Exp(1)``), which draws from
``p`` exactly and needs one noise row per request. A seeded request's noise comes from its own
``torch.Generator``, reseeded every step from ``(seed, num_output_tokens)``: the same request
gives the same tokens whatever else is in the batch, and again after a preemption.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridkv.sampling_params import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15


@dataclass(frozen=True, slots=True)
class SampleRequest:
    request_id: str
    params: SamplingParams
    num_output_tokens: int


@dataclass(frozen=True, slots=True)
class SampleResult:
    """``invalid_rows``: rows whose logits hold NaN or +inf (or only -inf): nothing can be
    sampled from them; their token and log-probability are meaningless."""

    token_ids: list[int]
    logprobs: list[float | None]
    invalid_rows: list[int]


class Sampler:
    """Unseeded requests draw from the sampler's own generator (seeded with the engine seed),
    never from torch's process-wide one."""

    def __init__(self, seed: int = 0) -> None:
        self._generators: dict[str, torch.Generator] = {}
        self._default = torch.Generator().manual_seed(seed)

    def drop(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, reqs: list[SampleRequest]) -> SampleResult:
        """``logits [S, V]`` float32, one row per request in ``reqs``."""
        invalid = invalid_logit_rows(logits)
        if invalid:
            logits = logits.clone()
            logits[invalid] = 0.0  # sample something harmless; the caller fails these rows
        temps = torch.tensor([r.params.temperature for r in reqs], dtype=torch.float32)
        greedy = temps == 0.0  # [S]
        chosen = logits.argmax(dim=-1)  # [S]
        if not bool(greedy.all()):
            random_rows = torch.nonzero(~greedy).flatten()
            sub = [reqs[i] for i in random_rows.tolist()]
            chosen[random_rows] = self._sample_random(logits[random_rows], temps[random_rows], sub)
        logprobs: list[float | None] = [None] * len(reqs)
        want = [i for i, r in enumerate(reqs) if r.params.logprobs is not None]
        if want:
            rows = torch.tensor(want, dtype=torch.long)
            values = torch.log_softmax(logits[rows], dim=-1)[torch.arange(len(want)), chosen[rows]]
            for i, value in zip(want, values.tolist(), strict=True):
                logprobs[i] = value
        return SampleResult(chosen.tolist(), logprobs, invalid)

    def _sample_random(
        self, logits: torch.Tensor, temps: torch.Tensor, reqs: list[SampleRequest]
    ) -> torch.Tensor:
        scaled = logits / temps[:, None]  # [S, V]
        scaled = _apply_top_k(scaled, [r.params.top_k for r in reqs])
        scaled = _apply_top_p(scaled, [r.params.top_p for r in reqs])
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


def _apply_top_k(logits: torch.Tensor, top_ks: list[int]) -> torch.Tensor:
    if not any(top_ks):
        return logits
    vocab = logits.shape[-1]
    ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks])  # [S]
    sorted_desc = logits.sort(dim=-1, descending=True).values  # [S, V]
    kth = sorted_desc.gather(1, (ks - 1)[:, None])  # [S, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def _apply_top_p(logits: torch.Tensor, top_ps: list[float]) -> torch.Tensor:
    if all(p >= 1.0 for p in top_ps):
        return logits
    ps = torch.tensor(top_ps, dtype=torch.float32)[:, None]  # [S, 1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [S, V]
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # [S, V]
    drop_sorted = mass_before >= ps  # keep the smallest prefix whose mass reaches p
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))

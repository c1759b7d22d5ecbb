"""Log-probabilities as vLLM returns them (``vllm.logprobs.Logprob``).

A completion's ``logprobs`` is one dict per generated token: the chosen token and the top k,
each a ``Logprob``. ``prompt_logprobs`` is the same per prompt token, with ``None`` first (the
first token has no context to be predicted from).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Logprob:
    """``logprob``: log-probability of the token; ``rank``: 1 for the most likely token (the
    chosen token's rank may exceed k); ``decoded_token``: its text, if detokenized."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


TokenLogprobs = dict[int, Logprob]  # token id -> Logprob, for one position
SampleLogprobs = list[TokenLogprobs]
PromptLogprobs = list[TokenLogprobs | None]

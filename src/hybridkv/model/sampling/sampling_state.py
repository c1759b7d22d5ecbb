"""Per-request sampling state the runner keeps between steps, synced from the request's tokens.

Only requests whose options need it have one: output-token counts (penalties), the set of
prompt tokens (repetition penalty), a grammar matcher (structured outputs), and the options'
token ids as tensors. ``sync`` consumes the output tokens added since the last step (one or a
few, so O(1) per step); if the request has fewer outputs than seen (a step's output was
discarded by recovery), the state is rewound.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hybridkv.sampling.params import SamplingParams


class RequestSamplingState:
    def __init__(self, params: SamplingParams, vocab_size: int, matcher: Any = None) -> None:
        self.params = params
        self.vocab_size = vocab_size
        self.matcher = matcher  # llguidance.LLMatcher, or None
        self.error: str | None = None
        self.seen = 0  # output tokens consumed
        self.counts = torch.zeros(vocab_size, dtype=torch.int32) if params.has_penalties else None
        self.prompt_mask: torch.Tensor | None = None
        bias = params.logit_bias or {}
        self.bias_ids = torch.tensor(list(bias), dtype=torch.long)
        self.bias_values = torch.tensor(list(bias.values()), dtype=torch.float32)
        allowed = params.allowed_token_ids
        self.allowed_ids = None if allowed is None else torch.tensor(allowed, dtype=torch.long)
        self.bad_words = tuple(params.bad_words_token_ids or ())

    def sync(self, history: Sequence[int], num_prompt: int, num_output: int) -> None:
        if self.prompt_mask is None and self.params.repetition_penalty != 1.0:
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)
            mask[torch.tensor(list(history[:num_prompt]), dtype=torch.long)] = True
            self.prompt_mask = mask
        if num_output < self.seen:
            self._rewind(history, num_prompt, num_output)
        new = list(history[num_prompt + self.seen : num_prompt + num_output])
        self.seen = num_output
        if not new:
            return
        if self.counts is not None:
            ids = torch.tensor(new, dtype=torch.long)
            self.counts.index_add_(0, ids, torch.ones(len(new), dtype=torch.int32))
        matcher = self.matcher
        if matcher is not None and self.error is None and not matcher.consume_tokens(new):
            self.error = f"the grammar rejected a token: {matcher.get_error()}"

    def _rewind(self, history: Sequence[int], num_prompt: int, num_output: int) -> None:
        if self.matcher is not None:
            self.matcher.rollback(self.seen - num_output)
        if self.counts is not None:
            self.counts.zero_()
            kept = list(history[num_prompt : num_prompt + num_output])
            if kept:
                ids = torch.tensor(kept, dtype=torch.long)
                self.counts.index_add_(0, ids, torch.ones(len(kept), dtype=torch.int32))
        self.seen = num_output

    def banned_bad_words(
        self, history: Sequence[int], num_prompt: int, num_output: int
    ) -> list[int]:
        """Last tokens of the bad words whose other tokens end the output so far (vLLM's rule:
        a bad word is never completed; a one-token bad word is always banned)."""
        end = num_prompt + num_output
        banned = []
        for word in self.bad_words:
            head = len(word) - 1
            if head == 0 or (
                num_output >= head and tuple(history[end - head : end]) == word[:head]
            ):
                banned.append(word[-1])
        return banned

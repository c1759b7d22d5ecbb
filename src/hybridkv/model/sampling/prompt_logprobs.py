"""Prompt logprobs of a step's chunks: the logits at prompt position p score prompt token p+1.

A chunk computing positions ``[s, e)`` of a prompt of P tokens scores tokens ``s+1 .. min(e,
P-1)``; chunked prefill therefore fills a request's prompt logprobs chunk by chunk, and the
request never takes a prefix-cache hit (``Request.skip_reading_prefix_cache``), so every
position is computed here.
"""

from __future__ import annotations

import torch

from hybridkv.model.models.common import CausalLM
from hybridkv.model.sampling.logprobs_compute import position_logprobs
from hybridkv.step_io import PromptLogprobsChunk, ScheduledRequest


def prompt_logprobs(
    model: CausalLM, hidden: torch.Tensor, requests: list[ScheduledRequest]
) -> dict[str, PromptLogprobsChunk]:
    """``hidden [T, H]``: the step's hidden states, requests' tokens concatenated in order."""
    out: dict[str, PromptLogprobsChunk] = {}
    offset = 0
    for req in requests:
        k = req.sampling_params.prompt_logprobs
        start, end = (
            req.start_pos,
            min(req.start_pos + len(req.token_ids), req.num_prompt_tokens - 1),
        )
        if k is not None and end > start:
            rows = hidden[offset : offset + end - start]
            targets = torch.tensor(list(req.all_token_ids[start + 1 : end + 1]), dtype=torch.long)
            entries = position_logprobs(model.compute_logits(rows), targets, [k] * (end - start))
            out[req.request_id] = PromptLogprobsChunk(start + 1, entries)
        offset += len(req.token_ids)
    return out

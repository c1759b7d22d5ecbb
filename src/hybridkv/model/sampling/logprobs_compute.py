"""Log-probabilities of chosen (or actual next) tokens, their ranks and the top k, batched."""

from __future__ import annotations

import torch

from hybridkv.step_io import PositionLogprobs


def position_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, ks: list[int]
) -> list[PositionLogprobs]:
    """``logits [R, V]`` (raw: vLLM's default ``raw_logprobs``), ``targets [R]``, per-row k.
    One log_softmax and one top-k for all rows; ranks count strictly more likely tokens."""
    if logits.shape[0] == 0:
        return []
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [R, V]
    chosen = logprobs.gather(1, targets[:, None])  # [R, 1]
    ranks = (logprobs > chosen).sum(dim=-1) + 1  # [R]
    k_max = min(max(ks), logits.shape[-1])
    top_values, top_ids = logprobs.topk(k_max, dim=-1) if k_max else (logprobs[:, :0],) * 2
    out = []
    rows = zip(
        targets.tolist(), chosen[:, 0].tolist(), ranks.tolist(), top_ids.tolist(),
        top_values.tolist(), ks, strict=True,
    )  # fmt: skip
    for target, value, rank, ids, values, k in rows:
        k = min(k, k_max)
        out.append(
            PositionLogprobs([target, *ids[:k]], [value, *values[:k]], [rank, *range(1, k + 1)])
        )
    return out

"""Token ids for tests that run tiny models."""

from __future__ import annotations

import torch


def random_ids(n: int, seed: int) -> list[int]:
    """``n`` token ids in [3, 1000) drawn from ``seed``: no special tokens, inside every tiny
    vocab (the same ids for a seed in every run, so references can be memoised)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1000, (n,), generator=gen).tolist()

"""The mixed B1 workload (``throughput_mixed.py``, ``llamacpp_mixed.py``, ``mixed_profile.py``):
N requests, prompt and output lengths uniform in their ranges, token ids drawn from a seeded
generator."""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from throughput import FIRST_TOKEN_ID


@dataclass(frozen=True, slots=True)
class MixedWorkload:
    num_requests: int
    prompt_range: tuple[int, int]
    output_range: tuple[int, int]
    concurrency: int
    repeats: int


@dataclass(frozen=True, slots=True)
class Requests:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_tokens(self) -> int:
        return sum(len(p) for p in self.prompts) + sum(self.output_lens)


def add_workload_args(p: argparse.ArgumentParser, num_requests: int, concurrency: int) -> None:
    """The mixed workload's options (both B1-mixed scripts; ``mixed_workload`` reads them)."""
    p.add_argument("--num-requests", type=int, default=num_requests)
    p.add_argument("--min-prompt", type=int, default=16)
    p.add_argument("--max-prompt", type=int, default=384)
    p.add_argument("--min-output", type=int, default=8)
    p.add_argument("--max-output", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=concurrency)


def mixed_workload(args: argparse.Namespace) -> MixedWorkload:
    return MixedWorkload(
        args.num_requests,
        (args.min_prompt, args.max_prompt),
        (args.min_output, args.max_output),
        args.concurrency,
        args.repeats,
    )


def make_requests(vocab_size: int, work: MixedWorkload, seed: int = 0) -> Requests:
    rng = random.Random(seed)
    prompts, outputs = [], []
    for _ in range(work.num_requests):
        n = rng.randint(*work.prompt_range)
        prompts.append([rng.randrange(FIRST_TOKEN_ID, vocab_size) for _ in range(n)])
        outputs.append(rng.randint(*work.output_range))
    return Requests(prompts, outputs)

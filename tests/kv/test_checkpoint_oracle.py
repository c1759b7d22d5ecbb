"""benchmarks/checkpoint_oracle.py against brute force on small random traces: the flow's
value is the exact optimum of the relaxed model (a request may store any boundary of its
chain), an upper bound on the real one (only boundaries at or past its own hit), and its
``feasible`` schedule a lower bound of the real one."""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import checkpoint_oracle as oracle  # noqa: E402

Trace = Sequence[tuple[tuple[int, ...], int]]  # (computed tokens, prompt length), block 1


def brute(trace: Trace, capacity: int, relaxed: bool) -> int:
    """Every choice of what to hold after each request, tried (block 1: a key is a prefix)."""
    wanted = {tuple(toks[:k]) for toks, _ in trace for k in range(1, len(toks) + 1)}

    @functools.cache
    def best(t: int, held: frozenset[tuple[int, ...]]) -> int:
        if t == len(trace):
            return 0
        toks, num_prompt = trace[t]
        keys = [toks[:k] for k in range(1, len(toks) + 1)]
        hit = max((d for d in range(1, num_prompt) if keys[d - 1] in held), default=0)
        made = {keys[d - 1] for d in range(1, len(toks) + 1) if relaxed or d >= hit}
        pool = sorted((held | made) & wanted)
        out = 0
        for mask in range(1 << len(pool)):
            if bin(mask).count("1") <= capacity:
                keep = frozenset(k for b, k in enumerate(pool) if mask >> b & 1)
                out = max(out, best(t + 1, keep))
        return hit + out

    return best(0, frozenset())


def random_trace(rng: random.Random) -> Trace:
    out = []
    for _ in range(rng.randint(3, 6)):
        toks = tuple(rng.randint(0, 1) for _ in range(rng.randint(1, 5)))
        out.append((toks, rng.randint(1, len(toks))))
    return out


@pytest.mark.parametrize("seed", range(60))
def test_flow_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    trace, capacity = random_trace(rng), rng.randint(1, 2)
    r = oracle.saved_tokens(oracle.chains_of(trace, 1), capacity, 1)
    assert r.saved == brute(trace, capacity, relaxed=True)
    real = brute(trace, capacity, relaxed=False)
    assert r.feasible <= real <= r.saved
    assert sum(r.hits) == r.saved


def test_belady_keeps_what_returns_first() -> None:
    """A, B, A, B, A with one slot: LRU hits nothing; holding A throughout hits twice."""
    a, b = (1, 1, 1, 1), (2, 2, 2, 2)
    trace = [(a, 4), (b, 4), (a, 4), (b, 4), (a, 4)]
    r = oracle.saved_tokens(oracle.chains_of(trace, 1), 1, 1)
    assert r.hits == (0, 0, 3, 0, 3) and r.exact
    two = oracle.saved_tokens(oracle.chains_of(trace, 1), 2, 1)
    assert two.hits == (0, 0, 3, 3, 3) and two.saved == 9


def test_a_shared_head_serves_every_branch() -> None:
    """One slot, a 3-block head then three branches: holding the head beats any branch end."""
    head = (7, 7, 7)
    trace = [(head + (i, i), 5) for i in range(4)]
    r = oracle.saved_tokens(oracle.chains_of(trace, 1), 1, 1)
    assert r.hits == (0, 3, 3, 3)


def test_work_weights_deep_hits_more() -> None:
    trace = oracle.chains_of([((1,) * 1024, 1024), ((1,) * 1024, 1024)], 16)
    tokens, work = oracle.saved_tokens(trace, 1, 16), oracle.saved_work(trace, 1, 16)
    assert tokens.saved == 1008  # 63 blocks: the prompt's last token always runs
    assert work.saved == round(1008 + 1008**2 / (2 * 8192))

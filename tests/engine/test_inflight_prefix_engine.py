"""The in-flight prefix rule through a real engine (``sched/inflight.py``): two prompts sent
together that share a long prefix -- the second waits for the first's prefill and hits the
prefix (at the caller's boundary on a hybrid), its greedy output the same as with prefix
caching off; the engine's metrics count the wait; nothing leaks. On a hybrid with no
checkpoint due in the shared prefix the second has nothing to wait for: admitted at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridkv import SamplingParams
from tests.engine.helpers import assert_no_leaks, greedy, make_llm, random_ids

SHARED = 96


@pytest.mark.parametrize("arch", ["qwen3", "granitemoehybrid"])
def test_concurrent_sharers_wait_hit_and_answer_the_same(
    checkpoints: dict[str, Path], arch: str
) -> None:
    shared = random_ids(SHARED, 5)
    prompts = [shared + random_ids(21, 6), shared + random_ids(13, 7)]
    params = greedy(6, extra_args={"cache_boundaries": [SHARED]})
    cached = make_llm(checkpoints[arch], block_size=16)
    plain = make_llm(checkpoints[arch], block_size=16, enable_prefix_caching=False)
    outs = cached.generate(prompts, params, use_tqdm=False)
    refs = plain.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [r.token_ids for r in refs]
    assert [o.num_cached_tokens for o in outs] == [0, SHARED]
    stats = cached.engine.stats().inflight
    assert stats.num_waits == 1 and stats.hit_tokens_gained == SHARED
    assert_no_leaks(cached.engine)


def test_with_the_rule_off_the_second_computes_the_prefix_too(
    checkpoints: dict[str, Path],
) -> None:
    shared = random_ids(SHARED, 5)
    prompts = [shared + random_ids(21, 6), shared + random_ids(13, 7)]
    llm = make_llm(checkpoints["qwen3"], block_size=16)
    llm.engine.scheduler.inflight.enabled = False
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    assert [o.num_cached_tokens for o in outs] == [0, 0]
    assert llm.engine.stats().inflight.num_waits == 0


def test_a_hybrid_with_no_due_checkpoint_in_the_prefix_does_not_wait(
    checkpoints: dict[str, Path],
) -> None:
    shared = random_ids(SHARED, 5)
    prompts = [shared + random_ids(21, 6), shared + random_ids(13, 7)]
    params = greedy(6)  # no caller boundary: the first's due ones are its prompt ends
    cached = make_llm(checkpoints["granitemoehybrid"], block_size=16)
    plain = make_llm(checkpoints["granitemoehybrid"], block_size=16, enable_prefix_caching=False)
    outs = cached.generate(prompts, params, use_tqdm=False)
    refs = plain.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [r.token_ids for r in refs]
    assert [o.num_cached_tokens for o in outs] == [0, 0]
    assert cached.engine.stats().inflight.num_waits == 0
    assert_no_leaks(cached.engine)

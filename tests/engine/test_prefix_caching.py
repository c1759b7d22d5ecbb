"""Prefix-cache hits through the engine: each later request reports exactly the cached prompt
tokens the rules allow, and its output equals a run with prefix caching off.

The rules: a hit is a whole number of blocks, at most N-1 prompt tokens (one token is always
computed to sample from), and valid in every group. A state (Mamba) group only resumes where a
checkpoint exists: at an earlier request's last prompt block boundary, at
``state_checkpoint_interval`` multiples, at a junction (the end of a longer full-attention hit
a previous request saw), or at the last boundary a finished request passed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hybridkv import SamplingParams
from hybridkv.engine.output import RequestOutput
from tests.engine.helpers import TOL, assert_no_leaks, greedy, make_llm, random_ids
from tests.support.checkpoints import HF_ARCHS

HAS_STATE = {"granitemoehybrid", "granitemoehybrid_moe"}


class Conversation:
    """The same requests, one after another, on an engine with and one without caching."""

    def __init__(self, model_dir: Path, **options: Any) -> None:
        self.cached = make_llm(model_dir, **options)
        self.plain = make_llm(model_dir, enable_prefix_caching=False, **options)
        self.outs: list[RequestOutput] = []

    def send(self, prompt: list[int], params: SamplingParams) -> RequestOutput:
        (out,) = self.cached.generate([prompt], params, use_tqdm=False)
        (ref,) = self.plain.generate([prompt], params, use_tqdm=False)
        assert out.token_ids == ref.token_ids, "prefix caching changed the output"
        diff = (torch.tensor(out.logits) - torch.tensor(ref.logits)).abs().max().item()
        assert diff < TOL, f"prefix caching moved logits by {diff:.2e}"
        assert ref.cached_tokens == {"local": 0}
        self.outs.append(out)
        return out

    def hits(self) -> list[int]:
        """Each request's local hit; ``cached_tokens`` has no other source here."""
        assert all(set(out.cached_tokens) == {"local"} for out in self.outs)
        return [out.cached_tokens["local"] for out in self.outs]

    def close(self) -> None:
        assert_no_leaks(self.cached.engine)
        assert_no_leaks(self.plain.engine)


@pytest.mark.parametrize("block_size", [16, 8])
@pytest.mark.parametrize("arch", HF_ARCHS)
def test_repeat_and_follow_up_hit_exactly(
    arch: str, block_size: int, checkpoints: dict[str, Path]
) -> None:
    conv = Conversation(checkpoints[arch], block_size=block_size)
    b = block_size
    first = random_ids(48, 10)  # a whole number of blocks: the N-1 cap matters
    a = conv.send(first, greedy(30, ignore_eos=True))
    conv.send(first, greedy(4, ignore_eos=True))
    # the next turn: everything the first request saw (it computed all but its last token)
    history = first + a.token_ids
    conv.send(history + random_ids(10, 11), greedy(4))
    expected = [
        0,
        (len(first) - 1) // b * b,  # capped at N-1; state: the prompt's last boundary
        (len(history) - 1) // b * b,  # state: the last boundary the first request passed
    ]
    assert conv.hits() == expected
    conv.close()


@pytest.mark.parametrize("interval", [512, 32])
@pytest.mark.parametrize("arch", HF_ARCHS)
def test_shared_prefix_hits_once_a_checkpoint_exists(
    arch: str, interval: int, checkpoints: dict[str, Path]
) -> None:
    conv = Conversation(checkpoints[arch], state_checkpoint_interval=interval)
    base = random_ids(100, 12)
    conv.send(base, greedy(4))  # state checkpoints at 96 (its last prompt boundary)
    conv.send(base[:64] + random_ids(40, 13), greedy(4))  # prompt boundaries at 96 only
    conv.send(base[:64] + random_ids(30, 14), greedy(4))
    if arch in HAS_STATE and interval == 512:
        # no state checkpoint at 64 before the second request; it saves one at the junction
        assert conv.hits() == [0, 0, 64]
    else:  # attention only, or a checkpoint every 32 tokens
        assert conv.hits() == [0, 64, 64]
    conv.close()


def test_granite_4h_system_prompt_of_64_tokens_hits(checkpoints: dict[str, Path]) -> None:
    conv = Conversation(checkpoints["granitemoehybrid_moe"], block_size=16)
    system = random_ids(64, 15)
    conv.send(system + random_ids(12, 16), greedy(6))
    conv.send(system + random_ids(20, 17), greedy(6))
    conv.send(system + random_ids(3, 18), greedy(6))
    assert conv.hits() == [0, 64, 64]
    conv.close()


def test_cache_salt_separates_tenants(checkpoints: dict[str, Path]) -> None:
    """vLLM's ``cache_salt``: a prefix is only shared between requests with the same salt (it
    salts block 0's hash, so every later hash, local or external, differs too)."""
    llm = make_llm(checkpoints["granitemoehybrid"])
    prompt = random_ids(48, 15)

    def hit(salt: str | None) -> int:
        item: dict[str, Any] = {"prompt_token_ids": prompt}
        if salt is not None:
            item["cache_salt"] = salt
        (out,) = llm.generate([item], greedy(2), use_tqdm=False)
        return out.cached_tokens["local"]

    assert [hit("alice"), hit("bob"), hit(None), hit("alice"), hit(None)] == [0, 0, 0, 32, 32]
    assert_no_leaks(llm.engine)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_repeated_batch_hits_on_a_hybrid_with_few_running(checkpoints: dict[str, Path]) -> None:
    """40 prompts, 4 running at a time, sent twice: the second pass resumes every prompt at its
    last checkpointed boundary. The state pool used to be sized by ``max_num_seqs`` alone (3 x
    4 + 16 slots, shared with live states), so it held a handful of checkpoints whatever the
    budget and the second pass hit almost nothing; it now has room for the budget."""
    llm = make_llm(checkpoints["granitemoehybrid"], max_num_seqs=4)
    prompts = [random_ids(40 + 7 * i, 500 + i) for i in range(40)]
    first = llm.generate(prompts, greedy(2), use_tqdm=False)
    second = llm.generate(prompts, greedy(2), use_tqdm=False)
    assert [o.token_ids for o in second] == [o.token_ids for o in first]
    hits = [o.cached_tokens.get("local", 0) for o in second]
    assert hits == [(len(p) - 1) // 16 * 16 for p in prompts]  # each at its last boundary
    assert_no_leaks(llm.engine)

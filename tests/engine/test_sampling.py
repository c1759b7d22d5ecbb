"""Sampling through the engine: seeds, stop strings, stop token ids, logprobs, chat."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridkv import SamplingParams
from tests.engine.helpers import (
    TOL,
    assert_no_leaks,
    greedy,
    hf_reference,
    make_engine,
    make_llm,
    random_ids,
    run_staggered,
)

ARCH = "granitemoehybrid"  # state, attention and chunked prefill all in one model


def sampled(seed: int | None, max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(temperature=1.5, seed=seed, max_tokens=max_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(checkpoints: dict[str, Path]) -> Path:
    return checkpoints[ARCH]


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(model_dir: Path) -> None:
    prompt = random_ids(30, 40)
    others = [random_ids(n, 41 + n) for n in (7, 50, 19)]
    alone = make_llm(model_dir).generate([prompt], sampled(7), use_tqdm=False)[0]
    again = make_llm(model_dir).generate([prompt], sampled(7), use_tqdm=False)[0]
    # in a batch with other (unseeded) sampled requests, arriving in the middle, chunked
    engine = make_engine(model_dir, max_num_batched_tokens=24, block_size=8)
    params = [sampled(None), sampled(None), sampled(7), sampled(3)]
    mixed = run_staggered(engine, [others[0], others[1], prompt, others[2]], params, 1)[2]
    assert alone.token_ids == again.token_ids == mixed.token_ids
    assert len(alone.token_ids) == 12
    # it really samples: other seeds give other tokens, and not the greedy ones
    others_seeds = make_llm(model_dir).generate(
        [prompt] * 3, [sampled(s) for s in (8, 9, 10)], use_tqdm=False
    )
    assert any(o.token_ids != alone.token_ids for o in others_seeds)
    greedy_ids, _ = hf_reference(model_dir, prompt, 8)
    assert alone.token_ids[:8] != greedy_ids
    assert_no_leaks(engine)


def test_engine_seed_makes_unseeded_sampling_reproducible(model_dir: Path) -> None:
    prompt = random_ids(20, 45)

    def run(seed: int, before: int) -> list[int]:
        torch.manual_seed(before)  # whatever the process did before must not matter
        llm = make_llm(model_dir, seed=seed)
        return llm.generate([prompt], sampled(None), use_tqdm=False)[0].token_ids

    assert run(1, before=100) == run(1, before=200)
    assert run(1, before=100) != run(2, before=100)


def test_the_engine_leaves_the_process_random_state_alone(model_dir: Path) -> None:
    torch.manual_seed(7)
    state = torch.random.get_rng_state()
    llm = make_llm(model_dir, seed=3)
    llm.generate([random_ids(20, 45)], sampled(None), use_tqdm=False)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_stop_string_cuts_the_text(model_dir: Path) -> None:
    llm = make_llm(model_dir)
    prompt = random_ids(25, 46)
    full = llm.generate([prompt], greedy(24, ignore_eos=True), use_tqdm=False)[0]
    stop = full.text[len(full.text) // 2 :][:3]  # a string first seen mid-output
    assert stop.strip(), f"output text too short to pick a stop string: {full.text!r}"
    cut = full.text.find(stop)
    out = llm.generate([prompt], greedy(24, ignore_eos=True, stop=[stop]), use_tqdm=False)[0]
    assert out.finish_reason == "stop"
    assert out.outputs[0].stop_reason == stop
    assert out.text == full.text[:cut]
    # generation stopped at the token that completed the stop string
    n = len(out.token_ids)
    assert out.token_ids == full.token_ids[:n]
    assert stop in llm.tokenizer.decode(full.token_ids[:n])
    assert stop not in llm.tokenizer.decode(full.token_ids[: n - 1])
    assert_no_leaks(llm.engine)


def test_stop_token_ids_finish_with_that_token(model_dir: Path) -> None:
    llm = make_llm(model_dir)
    prompt = random_ids(25, 47)
    full = llm.generate([prompt], greedy(16, ignore_eos=True), use_tqdm=False)[0]
    token = full.token_ids[5]
    at = full.token_ids.index(token)
    params = greedy(16, ignore_eos=True, stop_token_ids=[token])
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert out.finish_reason == "stop"
    assert out.outputs[0].stop_reason == token
    assert out.token_ids == full.token_ids[: at + 1]
    assert out.text == llm.tokenizer.decode(full.token_ids[:at])  # the stop token is not text


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logprobs_are_log_softmax_of_the_kept_logits(model_dir: Path, temperature: float) -> None:
    """vLLM's shape: per token {id: Logprob(logprob, rank, decoded_token)}, the chosen token
    and the top k (ranks 1..k; the chosen one's rank counts the more likely tokens)."""
    llm = make_llm(model_dir)
    params = SamplingParams(
        temperature=temperature, seed=3, max_tokens=10, ignore_eos=True, logprobs=5
    )
    prompts = [random_ids(12, 48), random_ids(40, 49)]
    for out in llm.generate(prompts, params, use_tqdm=False):
        logprobs = out.outputs[0].logprobs
        assert logprobs is not None and len(logprobs) == len(out.token_ids) == 10
        expected = torch.log_softmax(torch.tensor(out.logits), dim=-1)  # [10, V]
        for i, (token, entry) in enumerate(zip(out.token_ids, logprobs, strict=True)):
            top = expected[i].topk(5)
            assert set(top.indices.tolist()) | {token} == set(entry)
            assert abs(entry[token].logprob - expected[i, token].item()) < 1e-5
            assert entry[token].rank == int((expected[i] > expected[i, token]).sum()) + 1
            assert entry[token].decoded_token == llm.tokenizer.decode([token], False)
            for rank, (tid, value) in enumerate(zip(top.indices, top.values, strict=True), 1):
                assert abs(entry[int(tid)].logprob - value.item()) < 1e-5
                assert entry[int(tid)].rank == rank or int(tid) == token
        chosen = expected[torch.arange(10), torch.tensor(out.token_ids)]
        cumulative = out.outputs[0].cumulative_logprob
        assert cumulative is not None and abs(cumulative - chosen.sum().item()) < 1e-4
    plain = llm.generate(prompts, greedy(4), use_tqdm=False)
    assert all(o.outputs[0].logprobs is None for o in plain)


def test_chat_applies_the_chat_template(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    messages = [
        {"role": "system", "content": "the cache is a block of memory"},
        {"role": "user", "content": "what is a state window"},
    ]
    llm = make_llm(model_dir)
    out = llm.chat(messages, greedy(8), use_tqdm=False)[0]
    hf_tok = AutoTokenizer.from_pretrained(model_dir)
    encoded = hf_tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    ids = list(encoded["input_ids"])
    assert out.prompt_token_ids == ids
    ref_ids, ref_logits = hf_reference(model_dir, ids, 8)
    assert out.token_ids == ref_ids
    assert (torch.tensor(out.logits) - ref_logits).abs().max().item() < TOL
    # a list of conversations gives one output each, in order
    two = llm.chat([messages, messages[1:]], greedy(8), use_tqdm=False)
    assert two[0].token_ids == out.token_ids
    assert len(two[1].prompt_token_ids) < len(ids)

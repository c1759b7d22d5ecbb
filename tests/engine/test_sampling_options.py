"""Sampling options end to end on a tiny hybrid model, each against a reference computed here:
transformers' ``generate`` with its own processors where it has one, otherwise greedy by hand
over transformers' logits; plus seeded runs that must repeat."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridkv import SamplingParams
from hybridkv.engine.request_prep import bad_words_token_ids
from tests.engine.helpers import assert_no_leaks, eos_ids, make_engine, make_llm, random_ids
from tests.support.checkpoints import hf_logits, hf_model

pytestmark = pytest.mark.slow
ARCH = "granitemoehybrid"  # state, attention and chunked prefill all in one model
N = 8


@pytest.fixture(scope="module")
def model_dir(checkpoints: dict[str, Path]) -> Path:
    return checkpoints[ARCH]


@torch.inference_mode()
def hf_generate(model_dir: Path, prompt: list[int], **kw: Any) -> list[int]:
    out = hf_model(model_dir).generate(
        torch.tensor([prompt]), max_new_tokens=N, do_sample=False, pad_token_id=0, **kw
    )
    return list(out[0, len(prompt) :].tolist())


def ours(model_dir: Path, prompt: list[int], **kw: Any) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=N, **kw)
    return make_llm(model_dir).generate([prompt], params, use_tqdm=False)[0].token_ids


@pytest.mark.parametrize("penalty", [0.3, 1.8])
def test_repetition_penalty_matches_transformers(model_dir: Path, penalty: float) -> None:
    prompt = random_ids(12, 60) * 2
    got = ours(model_dir, prompt, repetition_penalty=penalty)
    assert got == hf_generate(model_dir, prompt, repetition_penalty=penalty)
    if penalty < 1:  # it favours the prompt's tokens: the greedy path changes
        assert got != ours(model_dir, prompt) and set(got) & set(prompt)


def test_bad_words_match_transformers(model_dir: Path) -> None:
    prompt = random_ids(20, 61)
    llm = make_llm(model_dir)
    plain = ours(model_dir, prompt)
    word = llm.tokenizer.decode([plain[1]]).strip()
    ids = bad_words_token_ids((word,), llm.tokenizer)
    got = ours(model_dir, prompt, bad_words=[word])
    assert got == hf_generate(model_dir, prompt, bad_words_ids=[list(w) for w in ids])
    assert not any(len(w) == 1 and w[0] in got for w in ids) and got != plain


def test_logit_bias_and_min_tokens_match_transformers(model_dir: Path) -> None:
    prompt = random_ids(20, 62)
    eos = min(eos_ids(model_dir))
    biased = ours(model_dir, prompt, logit_bias={eos: 30.0})
    assert biased == [eos]  # the bias makes eos win at once
    got = ours(model_dir, prompt, logit_bias={eos: 30.0}, min_tokens=5)
    want = hf_generate(model_dir, prompt, sequence_bias={(eos,): 30.0}, min_new_tokens=5)
    assert got == want and len(got) == 6 and got[-1] == eos


def test_allowed_token_ids_match_transformers_suppress_tokens(model_dir: Path) -> None:
    prompt = random_ids(20, 63)
    allowed = [7, 77, 177, 277, 377]
    vocab = hf_model(model_dir).config.vocab_size
    got = ours(model_dir, prompt, allowed_token_ids=allowed)
    others = [t for t in range(vocab) if t not in allowed]
    assert got == hf_generate(model_dir, prompt, suppress_tokens=others)
    assert set(got) <= set(allowed)


def test_frequency_and_presence_penalties_by_hand(model_dir: Path) -> None:
    prompt = random_ids(16, 64)
    freq, pres = 0.9, 0.6
    ids = list(prompt)
    for _ in range(N):  # greedy by hand over transformers' logits
        logits = hf_logits(model_dir, ids)[-1].clone()
        for token, count in Counter(ids[len(prompt) :]).items():
            logits[token] -= freq * count + pres
        ids.append(int(logits.argmax()))
    got = ours(model_dir, prompt, frequency_penalty=freq, presence_penalty=pres, ignore_eos=True)
    assert got == ids[len(prompt) :]


def test_min_p_keeps_sampled_tokens_above_the_threshold(model_dir: Path) -> None:
    prompt = random_ids(16, 65)
    params = [SamplingParams(min_p=0.3, seed=s, max_tokens=N, ignore_eos=True) for s in range(6)]
    llm = make_llm(model_dir)
    outs = llm.generate([prompt] * 6, params, use_tqdm=False)
    for out in outs:
        assert out.logits is not None
        probs = torch.softmax(torch.tensor(out.logits), -1)  # temperature 1
        chosen = probs[torch.arange(N), torch.tensor(out.token_ids)]
        assert (chosen >= 0.3 * probs.max(-1).values).all()
    again = make_llm(model_dir).generate([prompt] * 6, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == [o.token_ids for o in again]


def test_every_option_seeded_repeats_and_batches_alike(model_dir: Path) -> None:
    params = SamplingParams(temperature=0.9, seed=11, max_tokens=N, presence_penalty=0.5,
                            frequency_penalty=0.3, repetition_penalty=1.2, min_p=0.05,
                            min_tokens=3, logit_bias={5: 2.0}, bad_words=["the"], top_k=50)  # fmt: skip
    prompt = random_ids(30, 66)
    alone = make_llm(model_dir).generate([prompt], params, use_tqdm=False)[0]
    engine = make_engine(model_dir, max_num_batched_tokens=16)
    llm = make_llm(model_dir, max_num_batched_tokens=16)
    mixed = llm.generate([random_ids(9, 67), prompt, random_ids(40, 68)],
                         [SamplingParams(seed=1), params, SamplingParams(temperature=0.0)],
                         use_tqdm=False)  # fmt: skip
    assert alone.token_ids == mixed[1].token_ids and len(alone.token_ids) == N
    assert_no_leaks(engine)


def test_n_computes_the_prompt_once_and_seeds_children(model_dir: Path) -> None:
    prompt = random_ids(40, 69)
    llm = make_llm(model_dir)
    params = SamplingParams(n=4, seed=5, max_tokens=N, ignore_eos=True)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3] and out.finished
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    block = llm.config.cache.block_size
    assert out.cached_tokens.get("local") == 3 * ((len(prompt) - 1) // block * block)
    for i, completion in enumerate(out.outputs):  # child i is the request with seed + i
        single = SamplingParams(seed=5 + i, max_tokens=N, ignore_eos=True)
        alone = make_llm(model_dir).generate([prompt], single, use_tqdm=False)[0]
        assert completion.token_ids == alone.token_ids
        assert completion.text == alone.text
    assert_no_leaks(llm.engine)


def test_n_abort_finishes_every_child(model_dir: Path) -> None:
    engine = make_engine(model_dir)
    engine.add_request(random_ids(30, 70), SamplingParams(n=3, max_tokens=50), "p")
    outs = engine.step()
    engine.abort_request("p")
    while engine.has_unfinished_requests():
        outs += engine.step()
    outs += engine.step()
    last = [o for o in outs if o.request_id == "p"][-1]
    assert last.finished and len(last.outputs) == 3
    assert {c.finish_reason for c in last.outputs} == {"abort"}
    assert_no_leaks(engine)


@pytest.mark.parametrize("options", [{}, {"max_num_batched_tokens": 16}])
def test_prompt_logprobs_match_transformers_even_after_a_prefix_hit(
    model_dir: Path, options: dict[str, Any]
) -> None:
    prompt = random_ids(45, 71)
    llm = make_llm(model_dir, **options)
    llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)  # cache the prompt
    params = SamplingParams(max_tokens=2, prompt_logprobs=3)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert out.num_cached_tokens == 0  # no hit: every prompt position is computed
    ref = torch.log_softmax(hf_logits(model_dir, prompt), -1)
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt)
    assert out.prompt_logprobs[0] is None
    for pos in range(1, len(prompt)):
        entry = out.prompt_logprobs[pos]
        assert entry is not None and len(entry) in (3, 4)
        assert abs(entry[prompt[pos]].logprob - ref[pos - 1, prompt[pos]].item()) < 1e-4
        top = ref[pos - 1].topk(3).indices.tolist()
        assert set(top) <= set(entry)


def test_max_tokens_none_runs_to_the_context_end(model_dir: Path) -> None:
    llm = make_llm(model_dir, max_model_len=40)
    prompt = random_ids(25, 72)
    out = llm.generate([prompt], SamplingParams(max_tokens=None, ignore_eos=True), use_tqdm=False)
    assert len(out[0].token_ids) == 15 and out[0].finish_reason == "length"


def test_truncate_prompt_tokens_keeps_the_last_tokens(model_dir: Path) -> None:
    prompt = random_ids(30, 73)
    llm = make_llm(model_dir)
    params = SamplingParams(temperature=0.0, max_tokens=4, truncate_prompt_tokens=10)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert out.prompt_token_ids == prompt[-10:]
    assert out.token_ids == ours(model_dir, prompt[-10:])[:4]


def test_stop_string_kept_with_include_stop_str_in_output(model_dir: Path) -> None:
    prompt = random_ids(20, 74)
    llm = make_llm(model_dir)
    full = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=N), use_tqdm=False)[0]
    stop = full.text[3:6]
    kw = {"temperature": 0.0, "max_tokens": N, "stop": [stop]}
    cut = llm.generate([prompt], SamplingParams(**kw), use_tqdm=False)[0]
    kept = llm.generate([prompt], SamplingParams(**kw, include_stop_str_in_output=True),
                        use_tqdm=False)[0]  # fmt: skip
    assert kept.text == cut.text + stop and full.text.startswith(kept.text)


def test_skip_special_tokens_false_shows_them(model_dir: Path) -> None:
    prompt = random_ids(20, 75)
    llm = make_llm(model_dir)
    special = 1  # <|im_start|>: not eos, special
    kw = {"temperature": 0.0, "max_tokens": 3, "logit_bias": {special: 100.0}}
    hidden = llm.generate([prompt], SamplingParams(**kw), use_tqdm=False)[0]
    shown = llm.generate([prompt], SamplingParams(**kw, skip_special_tokens=False),
                         use_tqdm=False)[0]  # fmt: skip
    assert hidden.token_ids == [special] * 3
    assert hidden.text == "" and shown.text == "<|im_start|>" * 3


def test_n_with_prompt_logprobs_computes_them_once(model_dir: Path) -> None:
    prompt = random_ids(40, 76)
    llm = make_llm(model_dir)
    params = SamplingParams(n=2, seed=1, max_tokens=2, prompt_logprobs=0)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(prompt)
    assert out.cached_tokens.get("local") == 32  # the second child hit the first's prompt


def test_ids_outside_the_vocabulary_fail_naming_the_field(model_dir: Path) -> None:
    llm = make_llm(model_dir)
    for params in (SamplingParams(logit_bias={10**6: 1.0}),
                   SamplingParams(allowed_token_ids=[10**6]),
                   SamplingParams(stop_token_ids=[10**6])):  # fmt: skip
        out = llm.generate([random_ids(5, 77)], params, use_tqdm=False)[0]
        assert out.finish_reason == "error" and out.error is not None
        assert "invalid sampling parameter" in out.error


def test_bad_words_are_tokenized_alone_and_after_a_space(model_dir: Path) -> None:
    tok = make_llm(model_dir).tokenizer
    ids = bad_words_token_ids(("cache", " window"), tok)
    plain, spaced = tok.encode("cache", False), tok.encode(" cache", False)
    assert tuple(plain) in ids
    assert (tuple(spaced) in ids) == (len(spaced) == len(plain) and spaced[0] != plain[0])
    assert tuple(tok.encode("window", False)) in ids  # leading spaces are stripped first

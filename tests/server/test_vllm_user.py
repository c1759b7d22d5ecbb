"""A vLLM user's offline scripts, unchanged, on a tiny random hybrid checkpoint:
``LLM(**vLLM's kwargs)``, ``LLM.beam_search`` with vLLM's ``BeamSearchParams``, and the APIs
hybridkv refuses by name (``vllm serve``'s launch line: ``test_openai_server.py``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from hybridkv import BeamSearchParams, SamplingParams
from tests.support.lifetimes import track

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> Any:
    from hybridkv import LLM

    return track(LLM(str(model_dir), gpu_memory_utilization=0.9, enforce_eager=True,
                     tensor_parallel_size=1, kv_cache_memory="64MiB", dtype="float32"))  # fmt: skip


def test_llm_takes_vllm_kwargs_with_one_warning(model_dir: Path, caplog: Any) -> None:
    from hybridkv import LLM

    options = {"enforce_eager": True, "swap_space": 4, "kv_cache_memory": "16MiB"}
    with (
        caplog.at_level(logging.WARNING, logger="hybridkv.engine.llm"),
        LLM(str(model_dir), **options),
    ):
        pass
    warnings = [r.getMessage() for r in caplog.records if "ignoring vLLM" in r.getMessage()]
    assert len(warnings) == 1
    assert "enforce_eager=True" in warnings[0] and "swap_space=4" in warnings[0]


def test_pooling_apis_are_refused_by_name(llm: Any) -> None:
    for method in ("embed", "encode", "score", "classify", "reward"):
        with pytest.raises(NotImplementedError, match=f"LLM.{method} is not supported.*generate"):
            getattr(llm, method)(["hi"])


def test_beam_width_one_is_greedy(llm: Any) -> None:
    prompt = "The key to a fast inference engine is"
    greedy = llm.generate(prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
                          use_tqdm=False)[0]  # fmt: skip
    (out,) = llm.beam_search([prompt], BeamSearchParams(beam_width=1, max_tokens=6,
                                                        ignore_eos=True))  # fmt: skip
    (best,) = out.sequences
    prompt_len = len(greedy.prompt_token_ids)
    assert best.tokens == greedy.prompt_token_ids + greedy.token_ids
    assert best.text == greedy.text and best.finish_reason == "length"
    assert len(best.logprobs) == 6 and best.tokens[:prompt_len] == greedy.prompt_token_ids


def test_beams_are_distinct_best_first_and_scored_by_their_tokens(llm: Any) -> None:
    params = BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True)
    outs = llm.beam_search(["Once upon a time", {"prompt": "1, 2, 3,"}], params)
    assert len(outs) == 2
    for out in outs:
        seqs = out.sequences
        assert len(seqs) == 3 and len({tuple(s.tokens) for s in seqs}) == 3
        scores = [s.cum_logprob / len(s.tokens) for s in seqs]  # length_penalty 1
        assert scores == sorted(scores, reverse=True)
        for s in seqs:
            new = s.tokens[len(s.tokens) - 5 :]
            chosen = sum(step[t].logprob for step, t in zip(s.logprobs, new, strict=True))
            assert chosen == pytest.approx(s.cum_logprob, abs=1e-4)


def test_beam_search_refusals(llm: Any) -> None:
    with pytest.raises(ValueError, match="max_logprobs >= 22"):
        llm.beam_search(["hi"], BeamSearchParams(beam_width=11, max_tokens=2))
    for bad in ({"beam_width": 0}, {"max_tokens": -1}, {"temperature": float("nan")}):
        with pytest.raises(ValueError, match="BeamSearchParams"):
            BeamSearchParams(**{"beam_width": 2, "max_tokens": 2, **bad})

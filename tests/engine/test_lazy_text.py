"""``LLM.generate`` (outputs for finished requests only) detokenizes a request without stop
strings once, when its output is built: the same text as decoding every step, aborted
requests included, for a fraction of the decode calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridkv.model.loading.tokenizer import Tokenizer
from tests.engine.helpers import assert_no_leaks, greedy, make_engine, make_llm, random_ids

ARCH = "qwen3"


@pytest.fixture(scope="module")
def model_dir(checkpoints: dict[str, Path]) -> Path:
    return checkpoints[ARCH]


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    decode = Tokenizer.decode

    def counted(self: Tokenizer, ids: list[int], skip_special_tokens: bool = True) -> str:
        calls[0] += 1
        return decode(self, ids, skip_special_tokens)

    monkeypatch.setattr(Tokenizer, "decode", counted)
    return calls


def test_generate_text_equals_the_full_decode_with_few_decode_calls(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm = make_llm(model_dir)
    prompts = [random_ids(n, 60 + n) for n in (5, 17, 33)]
    calls = _count_decodes(monkeypatch)
    outs = llm.generate(prompts, greedy(24, ignore_eos=True), use_tqdm=False)
    for out in outs:
        assert len(out.token_ids) == 24
        assert out.text == llm.tokenizer.decode(out.token_ids)
    # two decodes per request when its output is built (one window), not two per step
    assert calls[0] <= 2 * len(prompts) + len(prompts), calls[0]
    assert_no_leaks(llm.engine)


def test_stop_strings_are_still_checked_every_step(model_dir: Path) -> None:
    llm = make_llm(model_dir)
    prompt = random_ids(21, 71)
    full = llm.generate([prompt], greedy(24, ignore_eos=True), use_tqdm=False)[0]
    stop = full.text[len(full.text) // 2 :][:3]
    assert stop.strip(), f"output text too short to pick a stop string: {full.text!r}"
    out = llm.generate([prompt], greedy(24, ignore_eos=True, stop=[stop]), use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.text == full.text[: full.text.find(stop)]
    assert len(out.token_ids) < 24  # stopped when the string appeared, not at the end


def test_an_aborted_request_reports_the_text_of_every_token(model_dir: Path) -> None:
    engine = make_engine(model_dir)
    engine.outputs.final_only = True
    req = engine.add_request(random_ids(9, 80), greedy(40, ignore_eos=True))
    for _ in range(6):
        assert engine.step() == []  # unfinished: no output, no text yet
    engine.abort_request(req.request_id)
    [out] = engine.outputs.take_finished_elsewhere()
    assert len(out.outputs[0].token_ids) >= 5
    assert out.outputs[0].text == engine.tokenizer.decode(out.outputs[0].token_ids)

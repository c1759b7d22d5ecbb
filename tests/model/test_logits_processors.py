"""The batched logits processors against transformers' processors (or by hand where it has
none): each option on a batch where other rows must stay untouched."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import llguidance.numpy as llnp
import numpy as np
import pytest
import torch
from transformers.generation import logits_process as hf

from hybridkv.model.sampling import logits_process as lp
from hybridkv.model.sampling.logits_batch import ProcessRow, process_logits
from hybridkv.model.sampling.logprobs_compute import position_logprobs
from hybridkv.model.sampling.sampler import Sampler, SampleRequest
from hybridkv.model.sampling.sampling_state import RequestSamplingState
from hybridkv.sampling.params import SamplingParams

V = 64
EOS = (2,)
PROMPT = [5, 9, 9, 11, 40, 63]


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def _history(outputs: Sequence[int]) -> list[int]:
    return [*PROMPT, *outputs]


def _process(logits: torch.Tensor, params: list[SamplingParams], outs: list[list[int]]):
    rows = []
    for i, (p, out) in enumerate(zip(params, outs, strict=True)):
        state = RequestSamplingState(p, V)
        history = _history(out)
        state.sync(history, len(PROMPT), len(out))
        rows.append(ProcessRow(i, p, state, history, len(PROMPT), len(out)))
    return process_logits(logits, rows, EOS, None)


OUTS = [[9, 17, 17, 3], [1, 1, 1, 1], [30, 31, 32, 33]]


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(penalty: float) -> None:
    logits = _logits(3)
    params = [SamplingParams(repetition_penalty=penalty)] * 2 + [SamplingParams()]
    got = _process(logits, params, OUTS)
    ids = torch.tensor([_history(o) for o in OUTS])
    want = hf.RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
    assert torch.allclose(got[:2], want[:2])
    assert torch.equal(got[2], logits[2])  # a row without the option is untouched


def test_frequency_and_presence_penalties_by_hand() -> None:
    logits = _logits(3, seed=1)
    params = [
        SamplingParams(frequency_penalty=0.7, presence_penalty=-0.4),
        SamplingParams(presence_penalty=1.5),
        SamplingParams(frequency_penalty=-2.0),
    ]
    got = _process(logits, params, OUTS)
    want = logits.clone()
    for row, (p, out) in enumerate(zip(params, OUTS, strict=True)):
        for token, count in Counter(out).items():  # output tokens only, not the prompt's
            want[row, token] -= p.frequency_penalty * count + p.presence_penalty
    assert torch.allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("min_p", [0.05, 0.3, 0.9])
def test_min_p_matches_transformers(min_p: float) -> None:
    scaled = _logits(3, seed=2) / 0.7
    got = lp.apply_min_p(scaled, torch.full((3,), min_p))
    want = hf.MinPLogitsWarper(min_p)(torch.zeros(3, 1, dtype=torch.long), scaled.clone())
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[~torch.isinf(got)], scaled[~torch.isinf(got)])


@pytest.mark.parametrize("num_out", [0, 2, 4])
def test_min_tokens_matches_transformers(num_out: int) -> None:
    logits = _logits(2, seed=3)
    outs = [[7] * num_out, [7] * num_out]
    params = [SamplingParams(min_tokens=4), SamplingParams(min_tokens=4, stop_token_ids=[9])]
    got = _process(logits, params, outs)
    ids = torch.tensor([_history(o) for o in outs])
    want = hf.MinNewTokensLengthLogitsProcessor(len(PROMPT), 4, list(EOS))(ids, logits.clone())
    assert torch.equal(got[0], want[0])
    banned = want[1].clone()
    if num_out < 4:
        banned[9] = float("-inf")  # stop_token_ids are held back too (vLLM)
    assert torch.equal(got[1], banned)


def test_min_tokens_with_ignore_eos_keeps_eos() -> None:
    logits = _logits(1, seed=3)
    got = _process(logits, [SamplingParams(min_tokens=4, ignore_eos=True)], [[]])
    assert torch.equal(got, logits)


def test_bad_words_match_transformers() -> None:
    logits = _logits(2, seed=4)
    words = ((5,), (17, 3), (3, 20), (1, 1, 8))
    params = SamplingParams(bad_words=("x",), bad_words_token_ids=words)
    got = _process(logits, [params, params], OUTS[:2])
    ids = torch.tensor([_history(o) for o in OUTS[:2]])
    want = hf.NoBadWordsLogitsProcessor([list(w) for w in words], EOS[0])(ids, logits.clone())
    assert torch.equal(got, want)
    assert torch.isinf(got[0, 20]) and torch.isinf(got[1, 8]) and not torch.isinf(got[0, 8])


def test_logit_bias_matches_transformers_sequence_bias() -> None:
    logits = _logits(2, seed=5)
    bias = {3: 5.0, 10: -2.5, 63: 100.0}
    got = _process(logits, [SamplingParams(logit_bias=bias), SamplingParams()], [[], []])
    seq_bias = [[[t], b] for t, b in bias.items()]
    ids = torch.tensor([PROMPT, PROMPT])
    want = hf.SequenceBiasLogitsProcessor(seq_bias)(ids, logits.clone())  # type: ignore[arg-type]
    assert torch.allclose(got[0], want[0]) and torch.equal(got[1], logits[1])


def test_allowed_token_ids_mask_every_other_token() -> None:
    logits = _logits(2, seed=6)
    got = _process(logits, [SamplingParams(allowed_token_ids=[4, 8, 15]), SamplingParams()],
                   [[], []])  # fmt: skip
    keep = torch.zeros(V, dtype=torch.bool)
    keep[[4, 8, 15]] = True
    assert torch.equal(got[0][keep], logits[0][keep]) and torch.isinf(got[0][~keep]).all()
    assert torch.equal(got[1], logits[1])


def test_token_bitmask_matches_llguidance() -> None:
    logits = _logits(3, seed=7)
    bitmask = np.random.default_rng(0).integers(-(2**31), 2**31, (3, 2), dtype=np.int32)
    bitmask[1] = -1  # all allowed
    bitmask[2, 0] = 0  # none of the first 32
    want = logits.numpy().copy()
    llnp.apply_token_bitmask_inplace(want, bitmask)
    got = lp.apply_token_bitmask(logits, bitmask)
    assert torch.equal(got, torch.from_numpy(want))


def test_penalty_state_is_incremental_and_rewinds() -> None:
    params = SamplingParams(frequency_penalty=1.0)
    state = RequestSamplingState(params, V)
    history = _history([3, 3, 4])
    for n in (1, 2, 3):  # one token per step
        state.sync(history[: len(PROMPT) + n], len(PROMPT), n)
    assert state.counts is not None and state.counts[3] == 2 and state.counts[4] == 1
    state.sync(history, len(PROMPT), 2)  # a step's token was discarded
    assert state.counts[3] == 2 and state.counts[4] == 0 and state.counts.sum() == 2


def test_position_logprobs_ranks_and_top_k() -> None:
    logits = _logits(3, seed=8)
    targets = torch.tensor([0, 5, 63])
    entries = position_logprobs(logits, targets, [0, 3, 5])
    logprobs = torch.log_softmax(logits, -1)
    for row, (entry, k) in enumerate(zip(entries, [0, 3, 5], strict=True)):
        target = int(targets[row])
        assert entry.token_ids[0] == target and len(entry.token_ids) == k + 1
        assert abs(entry.logprobs[0] - logprobs[row, target].item()) < 1e-6
        assert entry.ranks[0] == int((logprobs[row] > logprobs[row, target]).sum()) + 1
        assert entry.token_ids[1:] == logprobs[row].topk(k).indices.tolist()
        assert entry.ranks[1:] == list(range(1, k + 1))


def test_sampler_applies_processors_before_greedy_argmax_and_reports_raw_logprobs() -> None:
    logits = _logits(2, seed=9)
    top = int(logits[0].argmax())
    reqs = [
        SampleRequest("a", SamplingParams(temperature=0.0, logit_bias={top: -100.0}, logprobs=0),
                      0, PROMPT, len(PROMPT)),
        SampleRequest("b", SamplingParams(temperature=0.0), 0, PROMPT, len(PROMPT)),
    ]  # fmt: skip
    out = Sampler().sample(logits, reqs)
    assert out.token_ids[0] != top and out.token_ids[1] == int(logits[1].argmax())
    raw = torch.log_softmax(logits[0], -1)[out.token_ids[0]].item()
    assert out.logprobs[0] is not None and abs(out.logprobs[0].logprobs[0] - raw) < 1e-6


def test_options_that_leave_no_token_fail_the_row() -> None:
    params = SamplingParams(allowed_token_ids=[5], bad_words=("x",), bad_words_token_ids=((5,),))
    reqs = [SampleRequest("a", params, 0, PROMPT, len(PROMPT)),
            SampleRequest("b", SamplingParams(), 0, PROMPT, len(PROMPT))]  # fmt: skip
    out = Sampler().sample(_logits(2), reqs)
    assert list(out.errors) == [0] and "leave no token" in out.errors[0]


def test_default_params_take_the_fast_path() -> None:
    assert not SamplingParams().needs_processing
    assert not SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=1).needs_processing
    assert not SamplingParams(min_p=0.1).needs_processing  # applied on the random path
    assert SamplingParams(min_tokens=1).needs_processing

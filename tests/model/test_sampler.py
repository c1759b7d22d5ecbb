"""Sampler: greedy, filters, seeds, logprobs, and the runner's per-request generators."""

from __future__ import annotations

import torch

from hybridkv.model.sampling.sampler import Sampler, SampleRequest
from hybridkv.sampling.params import SamplingParams


def _req(rid: str, n_out: int = 0, **params: object) -> SampleRequest:
    return SampleRequest(rid, SamplingParams(**params), n_out)  # type: ignore[arg-type]


def _logits(rows: int = 4, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_and_logprob_is_log_softmax() -> None:
    logits = _logits()
    reqs = [_req(str(i), temperature=0.0, logprobs=i % 2 == 0) for i in range(4)]
    out = Sampler().sample(logits, reqs)
    assert out.token_ids == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits[0], -1)[out.token_ids[0]].item()
    assert out.logprobs[0] is not None and abs(out.logprobs[0].logprobs[0] - expected) < 1e-6
    assert out.logprobs[0].token_ids == [out.token_ids[0]]  # logprobs=True: the chosen only
    assert out.logprobs[1] is None


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    logits = _logits()
    reqs = [
        _req("a", top_k=1),
        _req("b", top_p=1e-6),
        _req("c", top_k=1, seed=5),
        _req("d", top_p=1e-6, seed=1),
    ]
    assert Sampler().sample(logits, reqs).token_ids == logits.argmax(-1).tolist()


def test_top_k_never_samples_outside_the_top_k() -> None:
    logits = _logits(rows=1, vocab=20)
    allowed = set(logits[0].topk(3).indices.tolist())
    sampler = Sampler()
    seen = {
        sampler.sample(logits, [_req("a", i, top_k=3, seed=i)]).token_ids[0] for i in range(200)
    }
    assert seen <= allowed and len(seen) > 1


def test_seeded_sampling_is_reproducible_and_batch_independent() -> None:
    logits = _logits()
    alone = Sampler().sample(logits[2:3], [_req("x", 7, seed=42)]).token_ids[0]
    others = [
        _req("p", temperature=1.0),
        _req("q", temperature=0.5),
        _req("x", 7, seed=42),
        _req("r"),
    ]
    batched = Sampler().sample(logits, others).token_ids[2]
    assert alone == batched
    draws = {Sampler().sample(logits[2:3], [_req("x", n, seed=42)]).token_ids[0] for n in range(40)}
    assert len(draws) > 1  # the offset by num_output_tokens changes the draw


def test_temperature_sampling_follows_the_distribution() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    sampler = Sampler()
    counts = torch.zeros(3)
    for i in range(3000):
        counts[sampler.sample(logits, [_req("a", i, seed=9)]).token_ids[0]] += 1
    expected = torch.softmax(logits[0], -1) * 3000
    assert (counts - expected).abs().max().item() < 120


def test_finished_requests_drop_their_generator() -> None:
    sampler = Sampler()
    sampler.sample(_logits(rows=1), [_req("a", seed=1)])
    assert "a" in sampler._generators
    sampler.drop(["a"])
    assert "a" not in sampler._generators


def test_greedy_fast_path_matches_argmax_breaks_ties_first_and_flags_bad_rows() -> None:
    """Plain greedy batches take the one-pass path: same tokens as torch's argmax (first
    index on ties), and a row with NaN, +inf or only -inf is still reported invalid."""
    logits = _logits(rows=5, vocab=64)
    logits[1, 7] = logits[1, 9] = logits[1].max() + 1.0  # a tie: the first index wins
    reqs = [_req(str(i), temperature=0.0) for i in range(5)]
    out = Sampler().sample(logits, reqs)
    assert out.token_ids == logits.argmax(-1).tolist() and out.token_ids[1] == 7
    assert out.invalid_rows == [] and out.logprobs == [None] * 5
    bad = logits.clone()
    bad[0, 3] = float("nan")
    bad[2, 5] = float("inf")
    bad[4] = float("-inf")
    out = Sampler().sample(bad, reqs)
    assert out.invalid_rows == [0, 2, 4]
    assert [out.token_ids[i] for i in (1, 3)] == [7, int(logits[3].argmax())]

"""Issue 26, findings 1, 2 and 7 with a real producer and consumer (two NIXL agents in one
process): forged or re-targeted params are refused and the request computes locally (exact),
a request the decode engine refuses frees the producer's KV at once, an exception of the
connector for one request fails that request alone, and a fuzzer mixing hostile params into
honest traffic leaves the consumer healthy and every answer exact."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hybridkv.engine.core import EngineCore
from hybridkv.engine.output import RequestOutput
from tests.connectors.nixl.pair import consumer, drain_clean, greedy, producer, run
from tests.engine.helpers import make_engine, random_ids
from tests.support.stats import flat_counters

Checkpoint = Callable[..., Path]


def failures(engine: EngineCore, reason: str) -> float:
    return flat_counters(engine.stats().transfer.connector).get(f"nixl_failures.{reason}", 0)


def prefill(p: EngineCore, prompt: list[int]) -> dict[str, Any]:
    params = run(p, prompt, greedy(1, {"do_remote_decode": True})).kv_transfer_params
    assert params is not None and params["num_tokens"] > 0
    return dict(params)


def holds(p: EngineCore) -> int:
    """Requests whose KV the producer still holds for a consumer."""
    assert p.scheduler.transfer is not None
    return len(p.scheduler.transfer.delayed_free)


@pytest.fixture
def trio(checkpoint: Checkpoint) -> Any:
    model = checkpoint("qwen3")
    p, d, plain = producer(model), consumer(model), make_engine(model)
    yield p, d, plain
    p.shutdown()
    d.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_forged_and_retargeted_params_compute_locally_and_exactly(trio: Any) -> None:
    p, d, plain = trio
    victim, mine = random_ids(80, 1), random_ids(80, 2)
    victims = prefill(p, victim)
    own = prefill(p, mine)
    attacks = [
        (mine, {**own, "remote_block_ids": victims["remote_block_ids"]}),  # another user's KV
        (mine, {**own, "remote_lease": [0, 2**62]}),  # a lease that always validated
        (mine, {k: v for k, v in own.items() if k != "remote_signature"}),  # unsigned
        (victim, own),  # genuine params with a popular prompt: would poison its cache
    ]
    for prompt, params in attacks:
        out = run(d, prompt, greedy(params=params), p)
        assert out.token_ids == run(plain, prompt, greedy()).token_ids
        assert out.cached_tokens.get("nixl", 0) == 0
    assert failures(d, "nixl_params_forged") == 4
    out = run(d, victim, greedy(params=victims), p)  # the victim's own still load
    hit = out.cached_tokens  # the 4th attack computed the prompt here: a local hit first
    assert hit["nixl"] > 0 and hit.get("local", 0) + hit["nixl"] == victims["num_tokens"]
    assert out.token_ids == run(plain, victim, greedy()).token_ids
    run(d, mine, greedy(params=own), p)  # the owner's: frees ``own`` on the producer
    drain_clean(p, d)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_refused_request_frees_the_producer_at_once(trio: Any) -> None:
    """The consumer refuses a body with valid params (a token id outside the vocabulary):
    the producer frees now, not after abort_timeout_seconds (120 s)."""
    p, d, _ = trio
    prompt = random_ids(60, 3)
    params = prefill(p, prompt)
    p.step()  # its lease starts
    assert holds(p) == 1
    with pytest.raises(ValueError, match="outside the vocabulary"):
        d.add_request(prompt + [10**6], greedy(params=params))
    deadline = time.monotonic() + 20
    while holds(p) and time.monotonic() < deadline:
        for engine in (d, p):
            if engine.has_unfinished_requests():
                engine.step()
    assert holds(p) == 0
    drain_clean(p, d)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_connector_error_fails_that_request_alone(
    trio: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    p, d, plain = trio
    assert d.connector is not None
    half = d.connector.scheduler
    lookup = half.get_num_new_matched_tokens

    def explode(request: Any, num_local: int) -> Any:
        if request.request_id == "bad":
            raise RuntimeError("boom")
        return lookup(request, num_local)

    monkeypatch.setattr(half, "get_num_new_matched_tokens", explode)
    prompt, other = random_ids(70, 4), random_ids(50, 5)
    params = prefill(p, prompt)
    d.add_request(other, greedy(params=prefill(p, other)), request_id="bad")
    d.add_request(prompt, greedy(params=params), request_id="good")
    outs: dict[str, RequestOutput] = {}
    deadline = time.monotonic() + 60
    while len(outs) < 2 and time.monotonic() < deadline:
        outs.update({o.request_id: o for o in d.step() if o.finished})
        if p.has_unfinished_requests():
            p.step()
    bad, good = outs["bad"], outs["good"]
    assert bad.finish_reason == "error" and bad.error is not None and "boom" in bad.error
    assert good.token_ids == run(plain, prompt, greedy()).token_ids
    assert good.cached_tokens["nixl"] == params["num_tokens"]  # the engine went on loading
    drain_clean(p, d)


FIELDS = ["remote_engine_id", "remote_host", "remote_port", "remote_request_id",
          "remote_block_ids", "remote_block_starts", "remote_state", "num_tokens",
          "remote_lease", "remote_expires_ms", "remote_signature"]  # fmt: skip
VALUES: list[Any] = [1e999, 10**30, -1, 0, 2**62, "10.1.2.3", "127.0.0.1", [[1, 2, 3]],
                     [[10**6]], [0], [0, 2**62], [], "ab" * 32, None, True, "x" * 300]  # fmt: skip


def hostile(rng: random.Random, own: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    params = dict(own)
    for _ in range(rng.randint(1, 3)):
        field = rng.choice(FIELDS)
        params[field] = rng.choice([*VALUES, other.get(field)])
    return params


FUZZ_ROUNDS = 12


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_fuzzed_params_leave_the_consumer_healthy_and_exact(trio: Any) -> None:
    """``FUZZ_ROUNDS`` rounds (a fixed seed: the same mutations on every machine, however
    loaded): each prefills two prompts, sends one's params mutated at random (a 400 when
    malformed, else a refusal and a local computation), then the honest ones; every answer
    equals a plain engine's, and the engines end with no block held."""
    p, d, plain = trio
    rng = random.Random(2626)
    expected: dict[tuple[int, ...], list[int]] = {}
    refused_at_the_boundary = 0
    for rounds in range(FUZZ_ROUNDS):
        prompt, other = random_ids(rng.randint(20, 90), rounds), random_ids(40, 10_000 + rounds)
        own, theirs = prefill(p, prompt), prefill(p, other)
        for target, params in ((prompt, hostile(rng, own, theirs)), (other, theirs)):
            try:
                sampling = greedy(params=params)
            except ValueError:  # what the HTTP layer answers with a 400
                refused_at_the_boundary += 1
                continue
            out = run(d, target, sampling, p)
            key = tuple(target)
            if key not in expected:
                expected[key] = run(plain, target, greedy()).token_ids
            assert out.finish_reason != "error" and out.token_ids == expected[key]
        run(d, prompt, greedy(params=own), p)  # the honest owner reads (or frees) its KV
    assert refused_at_the_boundary > 0
    drain_clean(p, d)
    assert d.has_unfinished_requests() is False

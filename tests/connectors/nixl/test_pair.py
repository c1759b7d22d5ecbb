"""NixlConnector between two engines in one process: outputs equal a plain engine's, bytes
equal the clipping formula, any block sizes, partial local hits, leases, failures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hybridkv.engine.core import EngineCore
from tests.connectors.nixl.pair import (
    consumer,
    disaggregated,
    drain,
    expected_bytes,
    greedy,
    producer,
    run,
    unclipped_bytes,
)
from tests.engine.helpers import make_engine, random_ids
from tests.support.stats import flat_counters

Checkpoint = Callable[..., Path]
LENGTHS = [5, 17, 40, 300]


def counters(engine: EngineCore) -> dict[str, float]:
    return flat_counters(engine.stats().transfer.connector)


def counter(engine: EngineCore, name: str) -> float:
    return counters(engine).get(name, 0.0)


def shutdown(*engines: EngineCore) -> None:
    for e in engines:
        e.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("arch", "bp", "bd"),
    [("qwen3", 16, 32), ("granitemoehybrid", 32, 16), ("gemma3", 32, 16)],
)
def test_outputs_and_bytes(checkpoint: Checkpoint, arch: str, bp: int, bd: int) -> None:
    """Every prompt: the decode engine's greedy tokens equal a plain engine's, it counts the
    transferred tokens as cached (source nixl), and both sides count exactly the formula's
    bytes. The pools end idle and consistent."""
    model = checkpoint(arch)
    plain, p, d = make_engine(model, block_size=bd), producer(model, bp), consumer(model, bd)
    try:
        for n in LENGTHS:
            prompt = random_ids(n, n)
            want = run(plain, prompt, greedy()).token_ids
            before = counter(d, "nixl_bytes.load"), counter(p, "nixl_bytes.send")
            t = disaggregated(p, d, prompt)
            end = t.prefill.kv_transfer_params["num_tokens"]  # type: ignore[index]
            assert t.decode.token_ids == want, n
            assert t.decode.cached_tokens.get("nixl", 0) == end
            nbytes = expected_bytes(d.layout, end, 0, bd)
            assert counter(d, "nixl_bytes.load") - before[0] == nbytes, n
            assert counter(p, "nixl_bytes.send") - before[1] == nbytes, n
        for e in (p, d):
            e.kv.check_integrity()
            assert e.kv.is_idle()
        assert counter(d, "nixl_handshakes") == 1
    finally:
        shutdown(p, d)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gemma3_clipping_moves_5x_fewer_bytes(checkpoint: Checkpoint) -> None:
    """A Gemma-3-like layout (5 sliding : 1 full) at a long prompt: the clipped transfer is
    at least 5x smaller than every prompt block of every group, and correct."""
    model = checkpoint("gemma3")
    p, d = producer(model), consumer(model)
    try:
        prompt = random_ids(2000, 7)
        t = disaggregated(p, d, prompt)
        moved = counter(d, "nixl_bytes.load")
        assert moved == expected_bytes(d.layout, len(prompt) - 1, 0, 16)
        assert unclipped_bytes(p.layout, len(prompt)) >= 5 * moved
        plain = make_engine(model)
        assert t.decode.token_ids == run(plain, prompt, greedy()).token_ids
    finally:
        shutdown(p, d)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", ["qwen3", "granitemoehybrid"])
def test_partial_local_hit_reads_only_the_rest(checkpoint: Checkpoint, arch: str) -> None:
    """The consumer already holds a prefix (from an earlier request): it reads only the
    tokens after its local hit, and the output is still exact."""
    model = checkpoint(arch)
    plain, p, d = make_engine(model), producer(model), consumer(model)
    try:
        prefix = random_ids(96, 1)
        run(d, prefix + random_ids(1, 2), greedy())  # colocated: checkpoints 96 tokens on D
        prompt = prefix + random_ids(150, 3)
        t = disaggregated(p, d, prompt)
        local = t.decode.cached_tokens["local"]
        end = t.prefill.kv_transfer_params["num_tokens"]  # type: ignore[index]
        assert 0 < local < end and t.decode.cached_tokens["nixl"] == end - local
        assert counter(d, "nixl_bytes.load") == expected_bytes(d.layout, end, local, 16)
        assert t.decode.token_ids == run(plain, prompt, greedy()).token_ids
        d.kv.check_integrity()
    finally:
        shutdown(p, d)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_unread_kv_is_freed_when_the_lease_expires(checkpoint: Checkpoint) -> None:
    model = checkpoint("qwen3")
    p = producer(model, abort_timeout_seconds=0.5)
    try:
        out = run(p, random_ids(70, 4), greedy(1, {"do_remote_decode": True}))
        assert out.kv_transfer_params is not None
        assert not p.kv.is_idle()  # held for a consumer
        drain(p, timeout=10)
        assert counter(p, "nixl_leases_expired") == 1
        p.kv.check_integrity()
        assert p.kv.is_idle()
    finally:
        shutdown(p)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_other_weights_are_refused_at_the_handshake(checkpoint: Checkpoint, policy: str) -> None:
    """A consumer with other weights refuses the producer's layout: under recompute it
    computes the prompt itself (its own plain output), under fail the request errors."""
    p = producer(checkpoint("qwen3"), abort_timeout_seconds=1.0)
    other = checkpoint("qwen3", seed=1)
    d, plain = consumer(other, policy=policy), make_engine(other)
    try:
        prompt = random_ids(60, 5)
        pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
        out = run(d, prompt, greedy(params=pre.kv_transfer_params), p)
        assert counter(d, "nixl_failures.nixl_incompatible") == 1
        if policy == "recompute":
            assert out.error is None and out.token_ids == run(plain, prompt, greedy()).token_ids
        else:
            assert out.error is not None and out.finish_reason == "error"
            assert "nixl_incompatible" in out.error and "weights" in out.error, out.error
            assert "same checkpoint" in out.error and p.connector is not None
        drain(p, d)
        assert p.kv.is_idle() and d.kv.is_idle()
    finally:
        shutdown(p, d)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_producer_gone_and_injected_faults_recompute(
    checkpoint: Checkpoint, caplog: pytest.LogCaptureFixture
) -> None:
    """A producer whose side channel is gone (connection refused), and a FaultInjection
    wrapper failing every NIXL load: the consumer recomputes and answers exactly."""
    model = checkpoint("granitemoehybrid")
    plain, p = make_engine(model), producer(model)
    faulty = {
        "kv_connector": "FaultInjection",
        "kv_connector_extra_config": {
            "inner": {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"},
            "request_failure_rate": 1.0,
        },
    }
    d, fd = consumer(model), make_engine(model, kv_transfer_config=faulty)
    try:
        prompt = random_ids(90, 6)
        want = run(plain, prompt, greedy()).token_ids
        pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
        out = run(fd, prompt, greedy(params=pre.kv_transfer_params), p)
        assert out.token_ids == want
        assert sum(v for k, v in counters(fd).items() if "fail" in k) >= 1
        prompt = random_ids(90, 8)  # not cached on P (a P-side hit at E stages no state)
        pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
        p.shutdown()  # the side channel closes: the handshake is refused
        out = run(d, prompt, greedy(params=pre.kv_transfer_params))
        assert out.token_ids == run(plain, prompt, greedy()).token_ids
        assert counter(d, "nixl_failures.nixl_handshake_failed") == 1, counters(d)
        assert "cannot reach the producer's side channel at 127.0.0.1:" in caplog.text
        drain(d, fd)
        assert d.kv.is_idle() and fd.kv.is_idle()
    finally:
        shutdown(d, fd)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_producer_prefix_hit_at_the_transfer_end_still_stages_the_state(
    checkpoint: Checkpoint,
) -> None:
    """A prompt the producer already holds up to E (an exact repeat): its state at E comes
    from the restored checkpoint, so the consumer still reads instead of recomputing."""
    model = checkpoint("granitemoehybrid")
    plain, p, d = make_engine(model), producer(model), consumer(model)
    try:
        prompt = random_ids(75, 9)
        run(p, prompt, greedy())  # caches the prompt (and its checkpoint at 64) on P
        t = disaggregated(p, d, prompt)
        assert t.prefill.cached_tokens["local"] == 64
        assert t.prefill.kv_transfer_params["num_tokens"] == 64  # type: ignore[index]
        assert t.decode.cached_tokens.get("nixl") == 64
        assert t.decode.token_ids == run(plain, prompt, greedy()).token_ids
        for e in (p, d):
            e.kv.check_integrity()
            assert e.kv.is_idle()
    finally:
        shutdown(p, d)

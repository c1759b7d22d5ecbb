"""A producer's lease expired (its blocks freed and reused) before a consumer's read started
or completed: the consumer never uses those bytes (the lease word check), recomputes under
``recompute`` (outputs equal a plain engine's) or fails with a text naming the cause under
``fail``; neither side leaks a block."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hybridkv.connectors.nixl.leases import ENDED, lease_pending, lease_valid
from hybridkv.connectors.nixl.worker import NixlWorker
from hybridkv.engine.core import EngineCore
from tests.connectors.nixl.pair import (
    consumer,
    drain,
    drain_clean,
    greedy,
    outliving,
    producer,
    run,
)
from tests.engine.helpers import make_engine, random_ids
from tests.support.stats import flat_counters

Checkpoint = Callable[..., Path]
LEASE = 0.3


def test_lease_word_verdicts() -> None:
    assert lease_valid(7, 7)  # active
    assert not lease_valid(0, 7) and not lease_valid(5 | ENDED, 7)  # not started: read again
    assert lease_pending(0, 7) and lease_pending(5 | ENDED, 7)
    assert not lease_pending(7 | ENDED, 7) and not lease_pending(9, 7)
    assert not lease_valid(7 | ENDED, 7)  # ended (read by someone, or expired)
    assert not lease_valid(9, 7) and not lease_valid(9 | ENDED, 7)  # the slot was reused


def expire_and_reuse(p: EngineCore, seed: int) -> None:
    """Let every lease of ``p`` expire, then compute another prompt into the freed blocks."""
    time.sleep(LEASE + 0.05)
    drain(p)
    run(p, random_ids(120, seed), greedy(1))


def worker_of(engine: EngineCore) -> NixlWorker:
    assert engine.connector is not None
    worker = engine.connector.worker
    assert isinstance(worker, NixlWorker)
    return worker


def expired(engine: EngineCore) -> float:
    return flat_counters(engine.stats().transfer.connector).get(
        "nixl_failures.nixl_lease_expired", 0
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("when", ["before_read", "during_read"])
@pytest.mark.parametrize("arch", ["qwen3", "granitemoehybrid"])
def test_a_late_reader_never_uses_released_blocks(
    checkpoint: Checkpoint, arch: str, when: str
) -> None:
    model = checkpoint(arch)
    p, d = producer(model, abort_timeout_seconds=LEASE), consumer(model)
    plain = make_engine(model)
    try:
        prompt = random_ids(150, 21)
        pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
        if when == "before_read":
            expire_and_reuse(p, 22)
        else:  # the data read lands, then the lease expires before the check
            agent = worker_of(d).agent
            post = agent.read

            def read(remote: str, descs: Any, notif: bytes) -> Any:
                handle = post(remote, descs, notif)
                if not notif:  # the data read (the lease check carries the notification)
                    expire_and_reuse(p, 23)
                return handle

            agent.read = read  # type: ignore[method-assign]
        out = run(d, prompt, greedy(params=outliving(p, pre.kv_transfer_params, prompt)), p)
        assert out.token_ids == run(plain, prompt, greedy()).token_ids
        assert expired(d) == 1
        assert out.cached_tokens.get("nixl", 0) == 0
        drain_clean(p, d)
    finally:
        p.shutdown()
        d.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_under_policy_fail_the_error_names_the_expired_lease(
    checkpoint: Checkpoint, caplog: pytest.LogCaptureFixture
) -> None:
    model = checkpoint("qwen3")
    p, d = producer(model, abort_timeout_seconds=LEASE), consumer(model, policy="fail")
    try:
        prompt = random_ids(90, 24)
        pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
        expire_and_reuse(p, 25)
        out = run(d, prompt, greedy(params=outliving(p, pre.kv_transfer_params, prompt)), p)
        assert out.finish_reason == "error" and out.error is not None
        for text in (out.error, caplog.text):
            assert "nixl_lease_expired" in text and "abort_timeout_seconds" in text, text
        drain(p, d)
        assert p.kv.is_idle() and d.kv.is_idle()
    finally:
        p.shutdown()
        d.shutdown()

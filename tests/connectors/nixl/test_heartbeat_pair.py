"""Lease heartbeats between two real engines: a request that waits in the consumer's queue for
several times the producer's ``abort_timeout_seconds`` still loads with heartbeats on; with them
off its lease expires and it recomputes. Outputs equal a plain engine's, no block leaks.

Time is a clock the test controls (the producer's leases and the consumer's heartbeat timer
read it): it moves only between steps, and never while a heartbeat is on its way, so nothing
depends on how fast this machine runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hybridkv.connectors.nixl.scheduler import NixlScheduler
from hybridkv.connectors.nixl.worker import NixlWorker
from hybridkv.engine.core import EngineCore
from hybridkv.request import RequestStatus
from tests.connectors.nixl.pair import drain_clean, greedy, nixl, producer, run
from tests.engine.helpers import make_engine, random_ids
from tests.support.stats import flat_counters

Checkpoint = Callable[..., Path]
LEASE = 100.0  # the producer's abort_timeout_seconds, in the test's clock
STEP = LEASE / 4  # the clock's advance per consumer step
WAIT = 5 * LEASE  # how long the request waits in the consumer's queue
BLOCKER_TOKENS = 400  # more steps than the wait takes: aborted after it


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def counter(engine: EngineCore, name: str) -> float:
    return flat_counters(engine.stats().transfer.connector).get(name, 0.0)


def halves(engine: EngineCore) -> tuple[NixlScheduler, NixlWorker]:
    assert engine.connector is not None
    sched, worker = engine.connector.scheduler, engine.connector.worker
    assert isinstance(sched, NixlScheduler) and isinstance(worker, NixlWorker)
    return sched, worker


def wait_behind_blocker(
    p: EngineCore, d: EngineCore, clock: Clock, prompt: list[int], params: dict[str, Any]
) -> str:
    """Run a blocker on ``d`` (max_num_seqs=1), queue the disaggregated request behind it and
    step both engines, the clock advancing by ``STEP`` per step once every heartbeat sent has
    reached the producer (only the engines' own steps deliver them); after ``WAIT`` of the
    clock, abort the blocker. Returns the request's id."""
    blocker = d.add_request(random_ids(20, 40), greedy(BLOCKER_TOKENS)).request_id
    d.step()  # the blocker runs: the next request waits
    rid = d.add_request(prompt, greedy(params=params)).request_id
    _, dw = halves(d)
    waited, deadline = 0.0, time.monotonic() + 120
    while waited < WAIT:
        assert time.monotonic() < deadline, "heartbeats did not reach the producer"
        assert d.scheduler.requests[rid].status is RequestStatus.WAITING
        received = counter(p, "nixl_heartbeats_received")
        if not dw.heartbeats.has_pending() and received >= counter(d, "nixl_heartbeats_sent"):
            clock.now += STEP
            waited += STEP
        d.step()
        if p.has_unfinished_requests():
            p.step()  # extends the lease, or expires it once its deadline passed
    d.abort_request(blocker)
    return rid


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("heartbeats", [True, False])
def test_a_request_waiting_past_the_lease(checkpoint: Checkpoint, heartbeats: bool) -> None:
    model = checkpoint("qwen3")
    clock = Clock()
    interval = LEASE / 2 if heartbeats else 0
    p = producer(model, abort_timeout_seconds=LEASE)
    config = nixl("kv_consumer", heartbeat_interval_seconds=interval)
    d = make_engine(model, kv_transfer_config=config, max_num_seqs=1)
    plain = make_engine(model)
    try:
        halves(p)[1].leases.clock = clock
        assert halves(p)[1].local.lease_seconds == LEASE  # consumers see it at the handshake
        waits = halves(d)[0].waits
        if waits is not None:
            waits.clock = clock
        prompt = random_ids(70, 41)
        pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
        assert pre.kv_transfer_params is not None
        rid = wait_behind_blocker(p, d, clock, prompt, pre.kv_transfer_params)
        out = None
        while out is None:
            out = next((o for o in d.step() if o.request_id == rid and o.finished), None)
            if p.has_unfinished_requests():
                p.step()
        assert out.token_ids == run(plain, prompt, greedy()).token_ids
        expired = counter(d, "nixl_failures.nixl_lease_expired")
        if heartbeats:
            assert out.cached_tokens.get("nixl", 0) == pre.kv_transfer_params["num_tokens"] > 0
            assert expired == 0 and counter(p, "nixl_leases_expired") == 0
            assert counter(d, "nixl_heartbeats_sent") >= WAIT / interval - 2  # ~one per interval
            assert counter(p, "nixl_heartbeats_received") == counter(d, "nixl_heartbeats_sent")
            assert counter(p, "nixl_heartbeats_unmatched") == 0
        else:
            assert expired == 1 and counter(p, "nixl_leases_expired") == 1
            assert counter(d, "nixl_heartbeats_sent") == 0
        drain_clean(p, d)
    finally:
        for e in (p, d):
            e.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_busy_consumer_delivers_a_notification_without_any_read(checkpoint: Checkpoint) -> None:
    """A full local hit on the consumer reads nothing and only notifies the producer, the first
    message to it (no READ wired the UCX endpoint up): it arrives while the consumer keeps
    stepping, and the producer frees at once, not after its lease (the consumer-only agent has
    no progress thread; before the worker progressed UCX every step this never arrived)."""
    model = checkpoint("qwen3")
    p = producer(model, abort_timeout_seconds=1000.0)
    d = make_engine(model, kv_transfer_config=nixl("kv_consumer"))
    try:
        prompt = random_ids(65, 3)
        run(d, prompt, greedy())  # colocated: the consumer holds the prompt's blocks
        pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
        assert pre.kv_transfer_params is not None and not p.kv.is_idle()
        out = run(d, prompt, greedy(params=pre.kv_transfer_params))
        assert out.cached_tokens == {"local": pre.kv_transfer_params["num_tokens"]}
        busy = d.add_request(random_ids(20, 9), greedy(BLOCKER_TOKENS)).request_id
        deadline = time.monotonic() + 60
        while not p.kv.is_idle():
            assert time.monotonic() < deadline, "the producer never heard from the consumer"
            d.step()
            p.step()
        d.abort_request(busy)
        drain_clean(p, d)
        assert counter(p, "nixl_leases_expired") == 0 and counter(d, "nixl_bytes.load") == 0
    finally:
        for e in (p, d):
            e.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("then_idle", [False, True])
def test_a_request_aborted_while_waiting_frees_the_producer_at_once(
    checkpoint: Checkpoint, then_idle: bool
) -> None:
    """Aborted in the consumer's queue (it never held KV): the producer hears it (NotifyOnly)
    and frees now, not after its lease; also when the consumer has nothing else to run (the
    pending message keeps it stepping until it has left)."""
    model = checkpoint("qwen3")
    p = producer(model, abort_timeout_seconds=1000.0)
    d = make_engine(model, kv_transfer_config=nixl("kv_consumer"), max_num_seqs=1)
    try:
        prompt = random_ids(70, 5)
        pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
        assert pre.kv_transfer_params is not None and not p.kv.is_idle()
        blocker = d.add_request(random_ids(20, 6), greedy(BLOCKER_TOKENS)).request_id
        d.step()
        rid = d.add_request(prompt, greedy(params=pre.kv_transfer_params)).request_id
        d.step()
        assert d.scheduler.requests[rid].status is RequestStatus.WAITING
        d.abort_request(rid)
        if then_idle:
            d.abort_request(blocker)
        deadline = time.monotonic() + 60
        while not p.kv.is_idle():
            assert time.monotonic() < deadline, "the producer never heard of the abort"
            assert d.has_unfinished_requests(), "the consumer went idle with the message unsent"
            d.step()
            p.step()
        d.abort_request(blocker)
        drain_clean(p, d)
        assert counter(p, "nixl_leases_expired") == 0 and counter(d, "nixl_bytes.load") == 0
    finally:
        for e in (p, d):
            e.shutdown()

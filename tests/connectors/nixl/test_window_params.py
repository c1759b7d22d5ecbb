"""A consumer with blocks 4x the producer's, given params that contradict the producer's
layout (two NIXL agents in one process; the params re-signed by the producer, so the reader's
own checks, not the signature, must catch them): the load fails alone with a reason naming the field,
the request is recomputed exactly, and the producer stays a known peer (no new handshake)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.connectors.nixl.pair import (
    consumer,
    disaggregated,
    drain,
    greedy,
    outliving,
    producer,
    run,
)
from tests.connectors.nixl.test_pair import counter, counters, shutdown
from tests.engine.helpers import make_engine, random_ids

Checkpoint = Callable[..., Path]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_contradicting_params_fail_the_load_and_keep_the_peer(
    checkpoint: Checkpoint, caplog: pytest.LogCaptureFixture
) -> None:
    model = checkpoint("gemma3")
    plain, p, d = make_engine(model), producer(model, 16), consumer(model, 64)
    forgeries: list[tuple[str, Any, str]] = [
        ("remote_block_size", lambda v: 32, "the producer's handshake says 16"),
        ("remote_block_starts", lambda v: [v[0], *(s + 4 for s in v[1:])], "needs them from"),
        ("remote_block_ids", lambda v: [t[:1] for t in v], "remote_block_ids of attention"),
    ]
    try:
        honest = disaggregated(p, d, random_ids(200, 1))  # the handshake happens here
        assert honest.decode.cached_tokens.get("nixl")
        for i, (field, forge, message) in enumerate(forgeries):
            prompt = random_ids(200, 10 + i)
            pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
            params = dict(pre.kv_transfer_params or {})
            params[field] = forge(params[field])
            params = outliving(p, params, prompt)  # signed: a producer's own contradiction
            out = run(d, prompt, greedy(params=params), p)
            assert out.token_ids == run(plain, prompt, greedy()).token_ids, field
            assert message in caplog.text, field
        assert counter(d, "nixl_failures.nixl_transfer_failed") == len(forgeries), counters(d)
        prompt = random_ids(300, 2)
        pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
        again = run(d, prompt, greedy(params=pre.kv_transfer_params), p)
        assert again.token_ids == run(plain, prompt, greedy()).token_ids
        assert again.cached_tokens.get("nixl")
        assert counter(d, "nixl_handshakes") == 1  # the producer was never forgotten
        drain(d)
        assert d.kv.is_idle()  # the producer keeps the forged requests' KV until its leases end
    finally:
        shutdown(p, d)

"""A prefill engine (a ``hybridkv serve`` process) SIGKILLed while a decode engine reads its KV:
the decode engine's load fails, it recomputes, its output equals a plain engine's, and it
leaks no block. The kill lands at a fixed point of the load, not after a sleep: when the
consumer posts its data READ, or after the data landed and before the lease word is read
(data without a valid lease check must never be used)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.connectors.nixl.pair import consumer, drain_clean, greedy, run
from tests.connectors.nixl.test_pair import counter, shutdown
from tests.e2e_pd.harness import complete, engine
from tests.engine.helpers import make_engine, random_ids
from tests.server.harness import SubprocessServer


def kill_before(agent: Any, method: str, server: SubprocessServer) -> list[int]:
    """Wrap ``agent.<method>`` (``read``: the data READ; ``read_prepared``: the lease word's)
    to SIGKILL the producer and wait for its death first; returns the kill count."""
    post, killed = getattr(agent, method), []

    def wrapped(*args: Any) -> Any:
        assert server.proc is not None
        if not killed:
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(30)
            killed.append(1)
        return post(*args)

    setattr(agent, method, wrapped)
    return killed


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", ["read", "read_prepared"])
def test_producer_killed_mid_load_recomputes(
    point: str, checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    model = checkpoint("granitemoehybrid")
    prompt = random_ids(200, 31)
    plain = make_engine(model)
    want = run(plain, prompt, greedy()).token_ids
    with engine(model, tmp_path / "p.log", "kv_producer") as p:
        body = complete(p.url, prompt, 1, kv_transfer_params={"do_remote_decode": True})
        params = body["kv_transfer_params"]
        assert params["do_remote_prefill"] and params["num_tokens"] > 0
        d = consumer(model, load_timeout_seconds=10.0)
        try:
            assert d.connector is not None
            killed = kill_before(d.connector.worker.agent, point, p)  # type: ignore[attr-defined]
            out = run(d, prompt, greedy(params=params))
            assert killed == [1]
            assert out.token_ids == want
            assert out.cached_tokens.get("nixl", 0) == 0  # nothing read counts as cached
            assert counter(d, "nixl_failures.nixl_transfer_failed") == 1
            drain_clean(d)  # no leaked block, KV consistent
        finally:
            shutdown(d, plain)

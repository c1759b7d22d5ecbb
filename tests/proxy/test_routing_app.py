"""The proxy app's book of work per engine: a streamed answer the client abandons, or one
that ends, gives its engine's request back (no phantom queue for the cost policy)."""

from __future__ import annotations

import time

import httpx

from hybridkv.proxy.app import create_proxy_app
from hybridkv.proxy.router import Router
from tests.proxy.backends import RawBackend, dies_after_events
from tests.server.harness import ThreadedServer


def test_an_abandoned_stream_gives_its_engine_back() -> None:
    with RawBackend(dies_after_events(3, then_hang=True)) as engine:
        app = create_proxy_app(Router([], [engine.url]))
        state = app.state.kv_routing.engines[engine.url]
        with ThreadedServer(app) as px:
            body = {"model": "m", "prompt": "abc", "max_tokens": 4, "stream": True}
            with httpx.stream("POST", px.url + "/v1/completions", json=body, timeout=10) as r:
                assert r.status_code == 200
                next(r.iter_bytes())  # the first event came: the engine holds the request
                assert state.num_inflight == 1
            deadline = time.monotonic() + 10
            while state.num_inflight and time.monotonic() < deadline:
                time.sleep(0.05)
            assert state.num_inflight == 0 and state.queued_tokens == 0

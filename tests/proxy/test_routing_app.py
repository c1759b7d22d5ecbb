"""The proxy app's book of work per engine: a streamed answer the client abandons gives its
engine's request back (no phantom queue for the cost policy); a stream that dies before its
first token is retried on the next engine (the request is idempotent until then); a stream's
first chunk's ``kv_events_seq`` is noted before its reservation goes (a decision waiting for
that prefill to land then waits for its events too), and seen once."""

from __future__ import annotations

import json
import time

import httpx

from hybridkv.kv_events.info import describe_engine
from hybridkv.proxy.app import create_proxy_app
from hybridkv.proxy.router import Router
from hybridkv.proxy.routing.engine_info import parse_engine_info
from hybridkv.proxy.routing.engines import EngineState
from hybridkv.proxy.routing.subscriber import EventSubscriber
from tests.kv.builders import make_layout
from tests.proxy.backends import (
    RawBackend,
    dies_after_events,
    dies_before_events,
    first_chunk_then_hang,
    forged_first_chunk,
)
from tests.server.fake_engine import expected_text
from tests.server.harness import ThreadedServer
from tests.server.test_fake_server import MODEL, make_app


def test_an_abandoned_stream_gives_its_engine_back() -> None:
    with RawBackend(dies_after_events(3, then_hang=True)) as engine:
        app = create_proxy_app(Router([], [engine.url]))
        state = app.state.kv_routing.engines[engine.url]
        with ThreadedServer(app) as px:
            body = {"model": "m", "prompt": "abc", "max_tokens": 4, "stream": True}
            with httpx.stream("POST", px.url + "/v1/completions", json=body, timeout=10) as r:
                assert r.status_code == 200
                chunks = r.iter_bytes()  # held: a dropped iterator closes the response
                next(chunks)  # the first event came: the engine holds the request
                assert state.num_inflight == 1
            deadline = time.monotonic() + 10
            while state.num_inflight and time.monotonic() < deadline:
                time.sleep(0.05)
            assert state.num_inflight == 0 and state.queued_tokens == 0


def test_a_stream_that_dies_before_its_first_token_is_retried_on_the_next_engine() -> None:
    app, _ = make_app()
    with RawBackend(dies_before_events) as dying, ThreadedServer(app) as healthy:
        router = Router([], [dying.url, healthy.url])
        with ThreadedServer(create_proxy_app(router)) as px:
            for _ in range(2):  # the dying engine comes first once in the turn
                body = {"model": MODEL, "prompt": "abc", "max_tokens": 4, "stream": True}
                r = httpx.post(px.url + "/v1/completions", json=body, timeout=30)
                assert r.status_code == 200
                texts = [
                    json.loads(e[6:])["choices"][0]["text"]
                    for e in r.text.split("\n\n")
                    if e.startswith("data: {")
                ]
                assert "".join(texts) == expected_text("abc", 4) and "error" not in r.text
            failures = router.stats.decode_failures
            assert failures == {dying.url: 1}


def test_a_first_chunks_seq_is_noted_before_its_reservation_goes() -> None:
    with RawBackend(first_chunk_then_hang) as engine:
        app = create_proxy_app(Router([], [engine.url]))
        state: EngineState = app.state.kv_routing.engines[engine.url]
        raw = describe_engine(None, make_layout("granite"), "sha256", True)
        state.info = parse_engine_info(raw, engine.url)  # indexed: its prompt is reserved
        state.subscriber = EventSubscriber(state.index, "ipc:///nowhere", "kv")
        state.subscriber.stats.last_seq = 0
        seen_when_released: list[int] = []

        class Pending(dict[bytes, int]):  # notes the seq known when the last block goes
            def pop(self, key: bytes, default: int = 0) -> int:  # type: ignore[override]
                value = super().pop(key, default)
                if not self:
                    seen_when_released.append(state.answered_seq)
                return value

        state.pending = Pending()
        with ThreadedServer(app) as px:
            body = {"model": "m", "prompt": list(range(100)), "max_tokens": 4, "stream": True}
            with httpx.stream("POST", px.url + "/v1/completions", json=body, timeout=10) as r:
                assert r.status_code == 200
                next(r.iter_bytes())
        assert seen_when_released[-1] == 5  # (the first: dispatched, before any bytes)


def test_a_streamed_first_chunk_is_seen_once() -> None:
    """Its forged ``kv_events_seq`` is counted once, not again by the relay."""
    with RawBackend(forged_first_chunk) as engine:
        app = create_proxy_app(Router([], [engine.url]))
        kv = app.state.kv_routing
        state: EngineState = kv.engines[engine.url]
        state.subscriber = EventSubscriber(state.index, "ipc:///nowhere", "kv")
        with ThreadedServer(app) as px:
            body = {"model": "m", "prompt": "abc", "max_tokens": 4, "stream": True}
            r = httpx.post(px.url + "/v1/completions", json=body, timeout=10)
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        assert kv.settle_stats.num_forged == 1

"""``hybridkv proxy`` over fake engines (no model): the prefill call's shape, params handed to
the decode engine, round robin, a failing prefill engine retried then colocated, streaming
passthrough, /health, /v1/models, /metrics. Hostile clients and failing engines:
test_proxy_trust.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack

import httpx
import pytest

from hybridkv.proxy.app import create_proxy_app
from hybridkv.proxy.router import Router
from tests.server.fake_engine import FakeEngine, expected_text
from tests.server.harness import ThreadedServer, free_port, scrape
from tests.server.test_fake_server import MODEL, make_app


@pytest.fixture
def engines() -> Iterator[list[tuple[ThreadedServer, FakeEngine]]]:
    with ExitStack() as stack:
        out = []
        for _ in range(3):  # two prefill engines, one decode engine
            app, fake = make_app()
            out.append((stack.enter_context(ThreadedServer(app)), fake))
        yield out


def proxy(prefill: list[str], decode: list[str]) -> ThreadedServer:
    return ThreadedServer(create_proxy_app(Router(prefill, decode)))


def post(url: str, **body: object) -> httpx.Response:
    payload = {"model": MODEL, "prompt": "abc", "max_tokens": 4, **body}
    return httpx.post(url + "/v1/completions", json=payload, timeout=30)


def test_prefill_then_decode_with_the_params(
    engines: list[tuple[ThreadedServer, FakeEngine]],
) -> None:
    (p0, f0), (p1, f1), (d, fd) = engines
    with proxy([p0.url, p1.url], [d.url]) as px:
        for _ in range(4):
            r = post(px.url)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected_text(
                "abc", 4
            )
            # the decode engine got the prefill engine's params (fake engines echo theirs)
            assert r.json()["kv_transfer_params"] == {"echo": {"echo": {"do_remote_decode": True}}}
        text = "".join(
            json.loads(line[6:])["choices"][0]["text"]
            for line in httpx.post(
                px.url + "/v1/completions",
                json={"model": MODEL, "prompt": "abc", "max_tokens": 4, "stream": True},
                timeout=30,
            ).text.split("\n\n")
            if line.startswith("data: {")
        )
        assert text == expected_text("abc", 4)
        values = scrape(px.url)
        assert values["hybridkv_proxy_requests_total{outcome=disaggregated}"] == 5
        models = httpx.get(px.url + "/v1/models", timeout=10).json()["data"]
        assert [m["id"] for m in models] == [MODEL]
        assert httpx.get(px.url + "/health", timeout=10).status_code == 200


def test_dead_prefill_engines_fall_back_to_colocated(
    engines: list[tuple[ThreadedServer, FakeEngine]],
) -> None:
    (p0, _), _, (d, _) = engines
    dead = f"http://127.0.0.1:{free_port()}"
    with proxy([dead, p0.url], [d.url]) as px:
        assert post(px.url).json()["kv_transfer_params"] is not None  # retried on p0
    with proxy([dead], [d.url]) as px:
        r = post(px.url)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected_text("abc", 4)
        assert r.json()["kv_transfer_params"] is None  # served colocated: no params sent
        values = scrape(px.url)
        assert values["hybridkv_proxy_requests_total{outcome=colocated}"] == 1
        # failed once, or skipped after a /health probe found it down
        assert (
            values.get(f"hybridkv_proxy_engine_failures_total{{engine={dead},role=prefill}}", 0)
            <= 1
        )
        assert values[f"hybridkv_proxy_engine_healthy{{engine={dead},role=prefill}}"] == 0
    with proxy([p0.url], [dead]) as px:
        assert post(px.url).status_code == 503
        assert httpx.get(px.url + "/health", timeout=10).status_code == 503

"""Slow is not down: an engine whose /health does not answer in time while it is answering
requests stays healthy (its requests waiting for a first token are not abandoned); one that
answers nothing at all is down. And a kept-alive connection the engine closes as the proxy
reuses it costs a resend, not a failed request."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hybridkv.proxy.app import create_proxy_app
from hybridkv.proxy.options import EngineTimeouts, ProxyOptions
from hybridkv.proxy.router import Router
from tests.proxy.backends import SSE_HEAD, RawBackend, chunk
from tests.server.harness import ThreadedServer, scrape, wait_for

# a probe unanswered after 0.3 s; the engine counts as answering while bytes came within 1 s
SLOW = EngineTimeouts(
    first_byte_seconds=60, idle_seconds=1, health_seconds=0.3, health_interval_seconds=0.2
)


def proxy(decode: list[str], timeouts: EngineTimeouts) -> ThreadedServer:
    return ThreadedServer(create_proxy_app(Router([], decode), ProxyOptions(timeouts=timeouts)))


def stream(events: int, first_after: float, every: float = 0.1):  # type: ignore[no-untyped-def]
    """An answer streaming ``events`` events, the first after ``first_after`` seconds."""

    async def answer(body: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        await writer.drain()
        await asyncio.sleep(first_after)
        for i in range(events):
            writer.write(chunk(b'data: {"choices": [{"index": 0, "text": "%d"}]}\n\n' % i))
            await writer.drain()
            await asyncio.sleep(every)
        writer.write(chunk(b"data: [DONE]\n\n") + chunk(b""))
        await writer.drain()

    return answer


def post_stream(url: str, prompt: str) -> list[str]:
    body = {"model": "m", "prompt": prompt, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line.startswith("data: ")]


@pytest.mark.slow
def test_an_engine_answering_requests_is_slow_not_down() -> None:
    # the engine never answers /health; one request streams an event every 0.1 s for 3 s,
    # another waits 2 s for its first token (a long prefill) meanwhile
    async def answer(body: bytes, writer: asyncio.StreamWriter) -> None:
        waits = json.loads(body)["prompt"] == "long prefill"
        await (stream(5, 2.0) if waits else stream(30, 0.0))(body, writer)

    with RawBackend(answer, hung_health=True) as engine, proxy([engine.url], SLOW) as px:
        healthy = f"hybridkv_proxy_engine_healthy{{engine={engine.url},role=decode}}"
        probes = f"hybridkv_proxy_health_probes_total{{engine={engine.url},result=%s}}"
        with ThreadPoolExecutor(2) as pool:
            streaming = pool.submit(post_stream, px.url, "short")
            wait_for(lambda: engine.num_posts == 1, what="the streaming request to start")
            # a probe sent before the first bytes came back may time out (a loaded host starts
            # the request late): count timeouts from the first probe that saw the engine answer
            wait_for(lambda: scrape(px.url).get(probes % "slow", 0) >= 1, what="a slow probe")
            timeouts_before = scrape(px.url).get(probes % "timeout", 0)
            waiting = pool.submit(post_stream, px.url, "long prefill")
            events = [waiting.result(30), streaming.result(30)]
        for got, n in zip(events, (5, 30), strict=True):  # whole: no error event
            assert got[-1] == "data: [DONE]" and len(got) == n + 1
            assert not any('"error"' in e for e in got)
        values = scrape(px.url)
        assert values[probes % "slow"] >= 2
        assert values.get(probes % "timeout", 0) == timeouts_before and values[healthy] == 1
        # nothing sent any more and still no /health answer: a hung engine, down
        wait_for(lambda: scrape(px.url)[healthy] == 0, timeout=10, what="the engine judged down")
        assert scrape(px.url)[probes % "timeout"] >= 1


async def whole(body: bytes, writer: asyncio.StreamWriter) -> None:
    answer = b'{"choices": [{"index": 0, "text": "ok"}]}'
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
    writer.write(b"content-length: %d\r\n\r\n%s" % (len(answer), answer))
    await writer.drain()


def test_a_connection_the_engine_closes_as_it_is_reused_is_resent() -> None:
    timeouts = EngineTimeouts(first_byte_seconds=30, health_seconds=5)
    body = {"model": "m", "prompt": "a", "max_tokens": 4}
    with RawBackend(whole) as engine, proxy([engine.url], timeouts) as px:
        for _ in range(2):  # the second on the first one's connection, which the engine closes
            r = httpx.post(px.url + "/v1/completions", json=body, timeout=30)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"
            engine.close_on_reuse.set()  # no sleep: reused within ENGINE_KEEPALIVE_SECONDS
        assert engine.num_closed_idle == 1 and engine.num_posts == 2  # resent, answered
        failures = scrape(px.url)
        assert not any(k.startswith("hybridkv_proxy_engine_failures_total") for k in failures)

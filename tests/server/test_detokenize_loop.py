"""A 16 MiB ``/detokenize`` does not hold the event loop (issue 26, finding 10): parsing,
checking and decoding its ~3.3M ids run on a worker thread, so /health answers meanwhile.

The tokenizer's ``vocab_size`` (read by the id range check, after the body is parsed) waits
until the test has seen /health answer: code that checks ids on the event loop deadlocks the
loop there, and the /health call times out."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.server.app import create_app
from hybridkv.server.async_engine import AsyncEngine
from hybridkv.server.state import ServerState
from tests.server.fake_engine import CharTokenizer, FakeEngine
from tests.server.harness import ThreadedServer

MODEL = "fake-model"


class GatedTokenizer(CharTokenizer):
    def __init__(self) -> None:
        self.checking = threading.Event()  # the range check has begun
        self.release = threading.Event()

    @property
    def vocab_size(self) -> int:
        self.checking.set()
        self.release.wait(30)
        return 256


@pytest.fixture
def served() -> Iterator[tuple[ThreadedServer, GatedTokenizer]]:
    fake, tokenizer = FakeEngine(), GatedTokenizer()
    metrics = ServerMetrics()
    engine = AsyncEngine(fake, metrics)  # type: ignore[arg-type]
    state = ServerState(engine, metrics, tokenizer, MODEL, fake.max_model_len)
    with ThreadedServer(create_app(state)) as server:
        yield server, tokenizer
    tokenizer.release.set()


def test_health_answers_during_a_16mib_detokenize(
    served: tuple[ThreadedServer, GatedTokenizer],
) -> None:
    server, tokenizer = served
    ids = [ord("a") + i % 26 for i in range(3_300_000)]
    body = json.dumps({"model": MODEL, "tokens": ids}).encode()
    assert 15 << 20 < len(body) <= 16 << 20  # just under --max-request-bytes
    answer: list[httpx.Response] = []

    def send() -> None:
        headers = {"content-type": "application/json"}
        answer.append(
            httpx.post(server.url + "/detokenize", content=body, headers=headers, timeout=60)
        )

    sender = threading.Thread(target=send)
    sender.start()
    try:
        assert tokenizer.checking.wait(30), "the detokenize never reached its id check"
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        assert not answer  # /health answered while the detokenize was still in progress
    finally:
        tokenizer.release.set()
        sender.join(60)
    assert answer[0].status_code == 200
    assert answer[0].json()["prompt"] == "".join(chr(i) for i in ids)


def test_bad_bodies_are_400_not_500(served: tuple[ThreadedServer, GatedTokenizer]) -> None:
    server, tokenizer = served
    tokenizer.release.set()
    for raw in (b"[" * 100_000 + b"]" * 100_000, b"{nope", b"[1, 2]"):
        for path in ("/detokenize", "/tokenize"):
            r = httpx.post(server.url + path, content=raw, timeout=30)
            assert r.status_code == 400, (path, raw[:10], r.text)
            assert r.json()["error"]["type"] == "invalid_request_error"

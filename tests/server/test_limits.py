"""Server limits over the fake engine (fast): body size and time, header time, a stalled
engine on /health, the API key from a file or the environment. The same limits against the
real server are in test_hostile.py."""

from __future__ import annotations

import argparse
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.server.app import create_app
from hybridkv.server.async_engine import AsyncEngine
from hybridkv.server.command import resolve_api_key
from hybridkv.server.limits import ServerLimits
from hybridkv.server.state import ServerState
from tests.server.fake_engine import FakeEngine
from tests.server.harness import ThreadedServer, scrape
from tests.support.waits import Gate, wait_for

MODEL = "fake-model"
LIMITS = ServerLimits(
    max_request_bytes=4096,
    engine_stall_seconds=0.5,
    header_timeout_seconds=0.5,
    body_timeout_seconds=0.5,
)


@pytest.fixture(scope="module")
def fake() -> FakeEngine:
    return FakeEngine(max_model_len=1 << 20)


@pytest.fixture(scope="module")
def server(fake: FakeEngine) -> Iterator[ThreadedServer]:
    metrics = ServerMetrics()
    engine = AsyncEngine(fake, metrics)  # type: ignore[arg-type]
    state = ServerState(engine, metrics, fake.tokenizer, MODEL, fake.max_model_len, LIMITS)
    with ThreadedServer(create_app(state), **LIMITS.uvicorn_options()) as srv:
        yield srv


def completion(server: ThreadedServer, prompt: str, **kw: object) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, **kw}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=30)


def test_body_over_the_limit_is_refused_while_reading(server: ThreadedServer) -> None:
    assert completion(server, "a" * 3000).status_code == 200
    r = completion(server, "a" * 5000)  # Content-Length says so: refused before reading
    assert r.status_code == 413 and "--max-request-bytes=4096" in r.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while it arrives
        yield b'{"model": "fake-model", "prompt": "'
        for _ in range(100):
            yield b"a" * 100
        yield b'"}'

    r = httpx.post(server.url + "/v1/completions", content=chunks(), timeout=30)
    assert r.status_code == 413
    assert scrape(server.url)["hybridkv:requests_refused_total{reason=too_large}"] == 2
    assert completion(server, "abc").json()["choices"][0]["text"] == "de"


def test_slow_body_and_slow_headers_are_cut_off(server: ThreadedServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
        sock.sendall(head.encode() + b'{"model": ')  # ... and the rest never comes
        assert sock.recv(4096).startswith(b"HTTP/1.1 408")
    assert scrape(server.url)["hybridkv:requests_refused_total{reason=body_timeout}"] == 1
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # headers never end
        start = time.monotonic()
        assert sock.recv(4096) == b""  # closed by the server
        assert time.monotonic() - start < 5
    assert completion(server, "abc").status_code == 200


def test_health_fails_while_a_step_is_stuck(server: ThreadedServer, fake: FakeEngine) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    fake.stall = Gate()
    with httpx.Client(timeout=30) as client:
        stuck = client.build_request(
            "POST", server.url + "/v1/completions", json={"model": MODEL, "prompt": "STALL"}
        )

        done: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: done.append(client.send(stuck)))
        worker.start()
        try:
            assert fake.stall.entered.wait(10), "the STALL step never started"
            health = server.url + "/health"  # the limit is 0.5 s: 503 once the step is over it
            wait_for(lambda: httpx.get(health).status_code == 503, what="/health to say 503")
            r = httpx.get(health)  # the step is still held
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_stalled"
        finally:
            fake.stall.release()
            worker.join(30)
    assert done and done[0].status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200  # it recovered


def test_tokenizing_runs_off_the_event_loop(server: ThreadedServer, fake: FakeEngine) -> None:
    fake.tokenizer.slow = Gate(limit=10.0)
    slow: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: slow.append(completion(server, "SLOWTOKENS")))
    worker.start()
    try:
        assert fake.tokenizer.slow.entered.wait(10), "the slow prompt was never tokenized"
        # its tokenizing is held until this answer arrives: were it on the event loop, this
        # request would be served only once the gate gave up (10 s) and let it through
        fast = completion(server, "abc")
        assert fake.tokenizer.slow.num_passed == 0
        assert fast.json()["choices"][0]["text"] == "de"
    finally:
        fake.tokenizer.slow.release()
        worker.join(30)
    assert slow and slow[0].status_code == 200


def test_api_key_from_file_or_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def args(**kw: object) -> argparse.Namespace:
        return argparse.Namespace(**{"api_key": None, "api_key_file": None, **kw})

    monkeypatch.delenv("HYBRIDKV_API_KEY", raising=False)
    assert resolve_api_key(args()) is None
    monkeypatch.setenv("HYBRIDKV_API_KEY", "from-env")
    assert resolve_api_key(args()) == "from-env"
    assert resolve_api_key(args(api_key="flag")) == "flag"
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    key_file.chmod(0o644)
    with pytest.raises(ValueError, match="--api-key-file: .* readable by others"):
        resolve_api_key(args(api_key_file=key_file))
    key_file.chmod(0o600)
    assert resolve_api_key(args(api_key_file=key_file)) == "from-file"
    with pytest.raises(ValueError, match="not both"):
        resolve_api_key(args(api_key="flag", api_key_file=key_file))
    key_file.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        resolve_api_key(args(api_key_file=key_file))


@pytest.mark.parametrize(
    "kw",
    [
        {"max_request_bytes": 0},
        {"engine_stall_seconds": float("nan")},
        {"max_queued_requests": True},
    ],
)
def test_limits_are_validated(kw: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be"):
        ServerLimits(**kw)  # type: ignore[arg-type]

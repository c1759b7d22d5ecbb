"""Stream clients that stop reading (issue 26, finding 9): a real uvicorn server over the fake
engine, raw sockets with a small receive buffer that send a streamed request and then read
nothing. Each is disconnected after ``stream_stall_seconds``, its request aborted (it leaves the
engine, its blocks freed), counted on /metrics, while other clients are served throughout;
the same against ``hybridkv serve`` over a tiny checkpoint."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.server.app import create_app
from hybridkv.server.async_engine import AsyncEngine
from hybridkv.server.limits import ServerLimits
from hybridkv.server.state import ServerState
from tests.server.fake_engine import FakeEngine, expected_text
from tests.server.harness import SubprocessServer, ThreadedServer, scrape, wait_for

MODEL = "fake-model"
LIMITS = ServerLimits(stream_stall_seconds=1.0)
STALLED = "hybridkv:stalled_clients_disconnected_total"


@pytest.fixture
def served() -> Iterator[tuple[ThreadedServer, FakeEngine]]:
    fake = FakeEngine(max_model_len=1 << 20, step_delay=0.002)
    metrics = ServerMetrics()
    engine = AsyncEngine(fake, metrics)  # type: ignore[arg-type]
    state = ServerState(engine, metrics, fake.tokenizer, MODEL, fake.max_model_len, LIMITS)
    options = LIMITS.uvicorn_options(on_stalled=metrics.on_stalled)
    with ThreadedServer(create_app(state), **options) as server:
        yield server, fake


def stalled_stream(port: int, **fields: object) -> socket.socket:
    """A streamed request for (nearly) endless output whose client then reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", port))
    fields = {"max_tokens": 1 << 19, "n": 8, **fields}
    body = json.dumps({"model": MODEL, "prompt": "a", "stream": True, **fields}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


@pytest.mark.slow
def test_clients_that_stop_reading_are_disconnected_and_aborted(
    served: tuple[ThreadedServer, FakeEngine],
) -> None:
    server, fake = served
    socks = [stalled_stream(server.port) for _ in range(4)]
    try:
        wait_for(lambda: len(fake.reqs) == 4, what="the four streams to run")
        # others are served while the four stall
        r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "k",
                       "max_tokens": 3}, timeout=30)  # fmt: skip
        assert r.json()["choices"][0]["text"] == expected_text("k", 3)
        wait_for(lambda: not fake.reqs, timeout=30, what="the stalled requests to be aborted")
        m = scrape(server.url)
        assert m[STALLED] == 4
        assert m["vllm:request_success_total{finished_reason=abort}"] == 4
        assert m["vllm:kv_cache_usage_perc"] == 0.0
        for sock in socks:  # the server closed the connection: reading ends (or is reset)
            sock.settimeout(10)
            _read_to_the_end(sock)  # a connection left open times out here
    finally:
        for sock in socks:
            sock.close()


def test_a_client_that_reads_is_not_disconnected(
    served: tuple[ThreadedServer, FakeEngine],
) -> None:
    """A long stream read to its end: no stall, no abort."""
    server, fake = served
    body = {"model": MODEL, "prompt": "a", "max_tokens": 1000, "stream": True, "n": 8}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        text = "".join(r.iter_text())
    assert text.endswith("data: [DONE]\n\n") and '"finish_reason":"length"' in text.replace(" ", "")
    assert scrape(server.url)[STALLED] == 0


def _read_to_the_end(sock: socket.socket) -> None:
    """Read until the server's end closes (EOF or reset)."""
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass


@pytest.mark.slow
def test_the_real_server_aborts_stalled_streams(tmp_path: Path) -> None:
    """``hybridkv serve`` over a tiny random checkpoint: two streams whose clients read
    nothing are aborted (their blocks freed) while another client is answered."""
    from hybridkv.model.loading.make_model import make_model

    model = make_model("granitemoehybrid", tmp_path / "model", size="tiny", seed=0)
    flags = ["--model", str(model), "--served-model-name", MODEL, "--max-model-len", "8192",
             "--kv-cache-memory", "128MiB", "--stream-stall-seconds", "1"]  # fmt: skip
    with SubprocessServer(flags, tmp_path / "server.log") as server:
        body = {"max_tokens": 8000, "n": 4, "logprobs": 20, "ignore_eos": True}
        socks = [stalled_stream(server.port, **body) for _ in range(2)]
        try:
            r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "hi",
                           "max_tokens": 4}, timeout=60)  # fmt: skip
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4

            def aborted() -> bool:
                m = scrape(server.url)
                return m[STALLED] == 2 and m["vllm:num_requests_running"] == 0

            wait_for(aborted, timeout=50, what="the stalled streams to be aborted")
            m = scrape(server.url)
            assert m["vllm:request_success_total{finished_reason=abort}"] == 2
            assert m["vllm:kv_cache_usage_perc"] == 0.0
        finally:
            for sock in socks:
                sock.close()

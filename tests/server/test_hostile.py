"""Issue 18's probes against the real server (``python -m hybridkv serve`` in a subprocess, a
tiny random hybrid checkpoint whose token 999 has a NaN embedding, as a forged KV unit would
give): each used to freeze, exhaust or crash the server; now each is refused or failed alone
while other requests are answered."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.harness import SubprocessServer, scrape, wait_for

pytestmark = pytest.mark.slow

NAME = "tiny-hybrid"
POISONED = 999  # its embedding row is NaN
FLAGS = ["--kv-cache-memory", "64MiB", "--max-num-seqs", "16", "--max-model-len", "512"]
FLAGS += ["--max-request-bytes", "24MiB", "--max-queued-requests", "64", "--seed", "0"]
JSON = {"content-type": "application/json"}
PROMPTS = ["The key to a fast inference engine is", "Once upon a time", "1, 2, 3, 4,"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import load_file, save_file

    from hybridkv.model.loading.make_model import make_model

    path = make_model("granitemoehybrid", tmp_path_factory.mktemp("model"), size="tiny", seed=0)
    weights = path / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["model.embed_tokens.weight"][POISONED] = float("nan")
    save_file(tensors, str(weights), {"format": "pt"})
    return path


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    with SubprocessServer(["--model", str(model_dir), "--served-model-name", NAME, *FLAGS], log) as srv:  # fmt: skip
        yield srv


def complete(server: SubprocessServer, timeout: float = 60, **body: Any) -> httpx.Response:
    body = {"model": NAME, "max_tokens": 4, "temperature": 0, **body}
    return httpx.post(server.url + "/v1/completions", json=body, timeout=timeout)


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise AssertionError(f"a bare {constant} in JSON: {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def assert_serving(server: SubprocessServer) -> None:
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    assert complete(server, prompt=PROMPTS[0], timeout=5).status_code == 200


@pytest.mark.timeout(120)
def test_oversized_body_is_refused(server: SubprocessServer) -> None:
    big = json.dumps({"model": NAME, "prompt": "a" * (25 << 20)}).encode()
    start = time.monotonic()
    r = httpx.post(server.url + "/v1/completions", content=big, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length
        for i in range(0, len(big), 1 << 20):
            yield big[i : i + (1 << 20)]

    r = httpx.post(server.url + "/v1/completions", content=chunked(), timeout=60)
    assert r.status_code == 413
    assert time.monotonic() - start < 30
    assert_serving(server)


@pytest.mark.timeout(120)
def test_a_20mb_prompt_does_not_freeze_other_requests(server: SubprocessServer) -> None:
    """Once 18 s of tokenization on the event loop; now refused by its length before."""
    big: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: big.append(complete(server, prompt="hi " * 7_000_000)))
    sender.start()
    latencies = []
    while sender.is_alive() or not latencies:
        start = time.monotonic()
        assert complete(server, prompt=PROMPTS[1], timeout=10).status_code == 200
        latencies.append(time.monotonic() - start)
    sender.join()
    assert big[0].status_code == 400 and "max_model_len=512" in big[0].json()["error"]["message"]
    assert max(latencies) < 3.0, latencies


@pytest.mark.timeout(120)
def test_a_300000_entry_stop_list_costs_no_engine_time(server: SubprocessServer) -> None:
    start = time.monotonic()
    r = complete(server, prompt=PROMPTS[0], stop=[f"s{i}" for i in range(300_000)])
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    assert "at most 64 strings" in r.json()["error"]["message"]
    assert time.monotonic() - start < 10
    assert_serving(server)


@pytest.mark.timeout(300)
def test_burst_of_400_with_a_queue_of_64(server: SubprocessServer) -> None:
    """Some requests are refused (503 + Retry-After); every accepted one is answered right."""
    want = {p: complete(server, prompt=p).json()["choices"][0]["text"] for p in PROMPTS}

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=400)
        async with httpx.AsyncClient(limits=limits, timeout=240) as client:
            body = [{"model": NAME, "prompt": PROMPTS[i % 3], "max_tokens": 4, "temperature": 0} for i in range(400)]  # fmt: skip
            sends = [client.post(server.url + "/v1/completions", json=b) for b in body]
            return list(await asyncio.gather(*sends))

    responses = asyncio.run(burst())
    refused = [r for r in responses if r.status_code == 503]
    accepted = [(i, r) for i, r in enumerate(responses) if r.status_code == 200]
    assert len(refused) + len(accepted) == 400, {r.status_code for r in responses}
    assert refused and len(accepted) >= 64, (len(refused), len(accepted))
    assert all(r.headers["retry-after"] and r.json()["error"]["code"] == "overloaded" for r in refused)  # fmt: skip
    for i, r in accepted:
        assert r.json()["choices"][0]["text"] == want[PROMPTS[i % 3]]
    assert scrape(server.url)["hybridkv:requests_refused_total{reason=overloaded}"] == len(refused)
    wait_for(lambda: scrape(server.url)["vllm:num_requests_waiting"] == 0, what="an empty queue")  # fmt: skip
    assert_serving(server)


@pytest.mark.timeout(120)
def test_non_finite_logits_fail_that_request_with_a_clear_error(server: SubprocessServer) -> None:
    prompt = [5, 17, 300, POISONED, 12]
    r = complete(server, prompt=prompt)
    error = strict_json(r.text)["error"]
    assert "non-finite logits" in error["message"] and error["code"] == "request_failed"
    body = {"model": NAME, "prompt": prompt, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as s:
        events = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and "non-finite logits" in events[-2]
    for e in events[:-1]:
        strict_json(e[6:])  # no bare NaN anywhere
    assert_serving(server)


@pytest.mark.timeout(120)
def test_hostile_values_are_400_not_500(server: SubprocessServer) -> None:
    cases: list[tuple[bytes, str]] = [
        (b'{"model": "tiny-hybrid", "prompt": "a\\ud800"}', "prompt"),
        (
            b'{"model": "tiny-hybrid", "messages": [{"role": "user", "content": "\\udfff"}]}',
            "messages",
        ),  # fmt: skip
        (b'{"model": "tiny-hybrid", "prompt": "hi", "max_tokens": 100000}', "max_tokens"),
    ]
    for raw, param in cases:
        path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
        r = httpx.post(server.url + path, content=raw, headers=JSON, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(server.url + "/v1/completions", content=b'{"model": "tiny-hybrid", "prompt": "a", "temperature": Infinity}', headers=JSON, timeout=30)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    # tiny temperatures are greedy, not "token 0 every time"
    greedy = complete(server, prompt=PROMPTS[2], max_tokens=8).json()["choices"][0]["text"]
    tiny = complete(server, prompt=PROMPTS[2], max_tokens=8, temperature=1e-40)
    assert tiny.json()["choices"][0]["text"] == greedy
    assert_serving(server)


@pytest.mark.timeout(120)
def test_cache_salt_keeps_tenants_apart(server: SubprocessServer) -> None:
    """vLLM's ``cache_salt``: a shared prefix cache is no timing channel between salts."""
    prompt = "A long shared system prompt for every tenant of this server. " * 6

    def cached(salt: str | None, path: str = "/v1/completions") -> int:
        body: dict[str, Any] = {"model": NAME, "max_tokens": 1, "temperature": 0}
        if path.endswith("chat/completions"):
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if salt is not None:
            body["cache_salt"] = salt
        r = httpx.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached("tenant-a") == 0
    assert cached("tenant-b") == 0 and cached(None) == 0  # another salt, or none: a miss
    assert cached("tenant-a") > 0  # the same salt hits
    chat = "/v1/chat/completions"
    assert cached("tenant-c", chat) == 0 and cached("tenant-d", chat) == 0
    assert cached("tenant-c", chat) > 0


def plant_hostile(files: list[Path], outside: Path) -> None:
    """Replace stored parts with a FIFO, a symlink out of the directory, a huge file with a
    valid header, and a truncated file, in turn."""
    for i, path in enumerate(sorted(files)):
        data = path.read_bytes()
        path.unlink()
        if i % 4 == 0:
            os.mkfifo(path)
        elif i % 4 == 1:
            path.symlink_to(outside)
        elif i % 4 == 2:
            path.write_bytes(data)
            with path.open("ab") as f:
                f.truncate(256 << 20)  # sparse: 256 MiB that must never be read
        else:
            path.write_bytes(data[: len(data) // 2])


@pytest.mark.timeout(300)
def test_file_connector_survives_a_hostile_directory(model_dir: Path, tmp_path: Path) -> None:
    """A restarted server whose FileConnector directory now holds FIFOs, symlinks, huge and
    truncated files: it stays responsive and answers as a clean run (loads fail, recompute)."""
    kv = {"kv_connector": "FileConnector", "kv_connector_extra_config": {"path": str(tmp_path / "kv"), "load_mode": "sync"}}  # fmt: skip
    args = ["--model", str(model_dir), "--served-model-name", NAME, *FLAGS]
    args += ["--kv-transfer-config", json.dumps(kv)]
    prompt = PROMPTS[0] * 12
    with SubprocessServer(args, tmp_path / "a.log") as first:
        want = complete(first, prompt=prompt, max_tokens=8).json()["choices"][0]["text"]
    files = [p for p in (tmp_path / "kv").rglob("*") if p.suffix in (".kv", ".state")]
    assert len(files) >= 4
    outside = tmp_path / "outside"
    outside.write_bytes(b"not yours")
    with SubprocessServer(args, tmp_path / "b.log") as second:  # indexes the good files
        plant_hostile(files, outside)
        start = time.monotonic()
        r = complete(second, prompt=prompt, max_tokens=8, timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
        assert time.monotonic() - start < 10
        assert_serving(second)
        metrics = scrape(second.url)
    assert outside.read_bytes() == b"not yours"
    assert sum(v for k, v in metrics.items() if k.startswith("hybridkv:kv_load_failures")) >= 1

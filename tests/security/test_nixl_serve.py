"""Issue 26, findings 1, 2 and 7 through real ``hybridkv serve`` processes (a producer and a
consumer with NixlConnector): ``"num_tokens": 1e999`` and ``"remote_port": 10**30`` are 400s
naming the field and the consumer stays healthy; forged params compute locally (exact, counted);
a body the consumer refuses (400) with genuine params frees the producer's KV at once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e_pd.harness import engine
from tests.e2e_pd.test_pd_e2e import metric
from tests.engine.helpers import random_ids
from tests.server.harness import scrape


def post(url: str, body: dict[str, Any] | str) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    headers = {"content-type": "application/json"}
    return httpx.post(url + "/v1/completions", content=content, headers=headers, timeout=120)


def request(prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}


def prefill(url: str, prompt: list[int]) -> dict[str, Any]:
    r = post(url, request(prompt, 1, kv_transfer_params={"do_remote_decode": True}))
    assert r.status_code == 200, r.text
    return dict(r.json()["kv_transfer_params"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hostile_params_over_http(checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    model = checkpoint("qwen3")
    with (
        engine(model, tmp_path / "p.log", "kv_producer") as p,
        engine(model, tmp_path / "d.log", "kv_consumer") as d,
    ):
        prompt = random_ids(60, 7)
        want = post(p.url, request(prompt, 6)).json()["choices"][0]["text"]
        params = prefill(p.url, prompt)
        # finding 1: one request used to kill the decode engine's thread for good
        body = json.dumps(request(prompt, 6, kv_transfer_params=params))
        for field, value in (("num_tokens", "1e999"), ("remote_port", str(10**30))):
            hostile = body.replace(f'"{field}": {json.dumps(params[field])}', f'"{field}": {value}')
            r = post(d.url, hostile)
            assert r.status_code == 400 and f"kv_transfer_params.{field}" in r.text, r.text
            assert httpx.get(d.url + "/health", timeout=5).status_code == 200
        # finding 2: another user's blocks under one's own params compute locally
        forged = {**params, "remote_block_ids": [[b + 1 for b in t] for t in params["remote_block_ids"]]}  # fmt: skip
        r = post(d.url, request(prompt, 6, kv_transfer_params=forged))
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
        assert metric(scrape(d.url), "kv_transfer_failures", reason="nixl_params_forged") == 1
        # the genuine params still load and answer the same
        r = post(d.url, request(prompt, 6, kv_transfer_params=params))
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
        # finding 7: a body the consumer refuses frees the producer's KV now (the lease: 120 s)
        other = random_ids(50, 8)
        sent = metric(scrape(p.url), "kv_transfer_requests", direction="send")
        refused = request(other, 6, min_tokens=50, kv_transfer_params=prefill(p.url, other))
        assert post(d.url, refused).status_code == 400
        deadline = time.monotonic() + 20
        while metric(scrape(p.url), "kv_transfer_requests", direction="send") == sent:
            assert time.monotonic() < deadline, "the producer still holds the refused KV"
            time.sleep(0.2)
        assert httpx.get(d.url + "/health", timeout=5).status_code == 200

"""``hybridkv serve --kv-events-config``: a subscriber sees the blocks a completion cached
(decoded with vLLM's schema), ``POST /reset_prefix_cache`` publishes ``AllBlocksCleared``, and
/metrics counts the batches."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import zmq

from tests.kv_events.vllm_schema import DECODER, AllBlocksCleared, BlockStored, KVEventBatch
from tests.server.harness import SubprocessServer, scrape
from tests.support.checkpoints import SharedCheckpoints

pytestmark = pytest.mark.slow


def next_batch(sub: zmq.Socket[bytes]) -> KVEventBatch:
    """The next batch with events (an idle engine's heartbeats are empty)."""
    return next_batch_seq(sub)[1]


def next_batch_seq(sub: zmq.Socket[bytes]) -> tuple[int, KVEventBatch]:
    while True:
        assert sub.poll(10000)
        _, seq, payload = sub.recv_multipart()
        batch = DECODER.decode(payload)
        if batch.events:
            return int.from_bytes(seq, "big"), batch


def test_serve_publishes_and_resets(tmp_path: Path, shared_checkpoints: SharedCheckpoints) -> None:
    model = shared_checkpoints.get("granitemoehybrid")
    endpoint = f"ipc://{tmp_path}/events.sock"
    events = {"enable_kv_cache_events": True, "endpoint": endpoint, "topic": "kv"}
    args = ["--model", str(model), "--served-model-name", "g", "--dtype", "float32",
            "--kv-cache-memory", "8MiB", "--max-model-len", "256", "--max-num-seqs", "4",
            "--kv-events-config", json.dumps(events)]  # fmt: skip
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    with SubprocessServer(args, tmp_path / "server.log") as server:
        info = httpx.get(server.url + "/kv_events", timeout=30).json()  # for a router
        assert info["kv_events"] == {"enabled": True, "endpoint": endpoint,
                                     "replay_endpoint": None, "topic": "kv"}  # fmt: skip
        assert info["block_size"] == 16 and info["hash_algo"] == "sha256" and info["caching"]
        assert {g["kind"] for g in info["groups"]} == {"full_attention", "mamba"}
        sub.connect(endpoint)
        body = {"model": "g", "prompt": list(range(3, 83)), "max_tokens": 2, "temperature": 0}
        stored: list[BlockStored] = []
        for _ in range(20):  # until the subscription reached the PUB socket
            r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            while sub.poll(1000):
                batch = DECODER.decode(sub.recv_multipart()[2])
                stored += [ev for ev in batch.events if isinstance(ev, BlockStored)]
            if stored:
                break
        assert stored and {ev.medium for ev in stored} == {"GPU"}
        assert any(ev.token_ids[:16] == list(range(3, 19)) for ev in stored)
        # a salted request's blocks: announced by hash alone (issue 26, finding 5)
        salted = {**body, "prompt": list(range(100, 180)), "cache_salt": "tenant-1"}
        r = httpx.post(server.url + "/v1/completions", json=salted, timeout=120)
        assert r.status_code == 200, r.text
        seq, batch = next_batch_seq(sub)
        news = [ev for ev in batch.events if isinstance(ev, BlockStored)]
        assert news and all(ev.token_ids == [] for ev in news)
        # the answer names the last batch published before it: the one with its blocks
        assert r.json()["usage"]["kv_events_seq"] == seq
        r = httpx.post(server.url + "/reset_prefix_cache", timeout=30)
        assert r.status_code == 200, r.text
        batch = next_batch(sub)
        assert isinstance(batch.events[0], AllBlocksCleared)
        # /metrics shows the engine's snapshot after its newest iteration; the publisher
        # thread counts a batch once sent, so the count shows after the next request
        body["max_tokens"] = 1
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=120).is_success
        metrics = scrape(server.url)
        assert metrics["hybridkv:kv_events_published_batches_total"] >= 2
        assert metrics["hybridkv:kv_events_dropped_batches_total"] == 0
    sub.close(linger=0)

"""``POST /reset_prefix_cache`` on a real tiny engine in a thread: 200 when idle (the next
request recomputes), 409 while a request runs (nothing changes), 400 for tiers the engine does
not have or a bad ``tiers`` value, 401 without the API key."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from hybridkv.config import EngineConfig
from hybridkv.engine.core import EngineCore
from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.server.app import create_app
from hybridkv.server.async_engine import AsyncEngine
from hybridkv.server.state import ServerState
from tests.server.harness import ThreadedServer
from tests.support.checkpoints import SharedCheckpoints

pytestmark = pytest.mark.slow

MODEL = "tiny"
KEY = "secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = [(5 * i) % 400 + 3 for i in range(80)]


@pytest.fixture(scope="module")
def served(shared_checkpoints: SharedCheckpoints) -> Iterator[tuple[str, EngineCore]]:
    ckpt = shared_checkpoints.get("qwen3")
    config = EngineConfig.create(str(ckpt), dtype="float32", kv_cache_memory="8MiB",
                                 block_size=16, max_model_len=512)  # fmt: skip
    engine = EngineCore(config)
    metrics = ServerMetrics()
    state = ServerState(AsyncEngine(engine, metrics), metrics, engine.tokenizer, MODEL, 512)
    with ThreadedServer(create_app(state, KEY)) as server:
        yield server.url, engine


def complete(url: str, max_tokens: int = 4) -> dict[str, object]:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def cached_tokens(response: dict[str, object]) -> int:
    usage = response["usage"]
    assert isinstance(usage, dict)
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def test_idle_reset_forgets_the_prefix(served: tuple[str, EngineCore]) -> None:
    url, engine = served
    first = complete(url)
    assert cached_tokens(complete(url)) > 0
    r = httpx.post(url + "/reset_prefix_cache", headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json() == {"reset": True, "tier_units_dropped": 0}
    again = complete(url)
    assert cached_tokens(again) == 0 and again["choices"] == first["choices"]


def test_busy_reset_is_409_and_changes_nothing(served: tuple[str, EngineCore]) -> None:
    url, engine = served
    complete(url)
    running = threading.Thread(target=complete, args=(url, 400))
    running.start()
    try:
        for _ in range(500):  # until the long request is in the engine
            r = httpx.post(url + "/reset_prefix_cache", headers=AUTH, timeout=30)
            if r.status_code == 409:
                break
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["code"] == "cache_busy" and "running or waiting" in error["message"]
    finally:
        running.join(120)
    assert cached_tokens(complete(url)) > 0  # the prefix survived the refused reset


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [("?tiers=true", 400, "no KV connector"), ("?tiers=maybe", 400, "must be true or false")],
)
def test_bad_tier_requests(
    served: tuple[str, EngineCore], query: str, status: int, message: str
) -> None:
    r = httpx.post(served[0] + "/reset_prefix_cache" + query, headers=AUTH, timeout=30)
    assert r.status_code == status and message in r.json()["error"]["message"]


def test_the_api_key_guards_the_reset(served: tuple[str, EngineCore]) -> None:
    r = httpx.post(served[0] + "/reset_prefix_cache", timeout=30)
    assert r.status_code == 401

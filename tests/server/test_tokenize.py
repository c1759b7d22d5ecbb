"""``/tokenize`` and ``/detokenize`` on a real server over the tiny Granite checkpoint: the ids
equal the tokenizer's and the chat route's prompt, detokenize inverts tokenize, and bad bodies,
unknown models, out-of-vocabulary ids and a missing API key are refused with a clear error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hybridkv.config import EngineConfig
from hybridkv.engine.core import EngineCore
from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.server.app import create_app
from hybridkv.server.async_engine import AsyncEngine
from hybridkv.server.state import ServerState
from tests.server.harness import ThreadedServer

pytestmark = pytest.mark.slow

MODEL = "tiny"
AUTH = {"Authorization": "Bearer k"}
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime."},
]


@pytest.fixture(scope="module")
def served(model_dir: Path) -> Iterator[tuple[str, EngineCore]]:
    config = EngineConfig.create(str(model_dir), dtype="float32", kv_cache_memory="8MiB")
    engine = EngineCore(config)
    metrics = ServerMetrics()
    state = ServerState(AsyncEngine(engine, metrics), metrics, engine.tokenizer, MODEL, 256)
    with ThreadedServer(create_app(state, "k")) as server:
        yield server.url, engine


def post(url: str, path: str, body: object) -> httpx.Response:
    # json.dumps escapes a lone surrogate as JSON allows ("\\ud800"); httpx's encoder cannot
    headers = {**AUTH, "content-type": "application/json"}
    return httpx.post(url + path, content=json.dumps(body), headers=headers, timeout=60)


def test_tokenize_a_prompt_equals_the_tokenizer(served: tuple[str, EngineCore]) -> None:
    url, engine = served
    text = "The quick brown fox, 42 times."
    got = post(url, "/tokenize", {"prompt": text, "return_token_strs": True}).json()
    ids = engine.tokenizer.encode(text)
    assert got["tokens"] == ids and got["count"] == len(ids) and got["max_model_len"] == 256
    assert got["token_strs"] == engine.tokenizer.convert_ids_to_tokens(ids)
    bare = post(url, "/tokenize", {"model": MODEL, "prompt": text, "add_special_tokens": False})
    assert bare.json()["tokens"] == engine.tokenizer.encode(text, add_special_tokens=False)
    assert bare.json()["token_strs"] is None
    back = post(url, "/detokenize", {"model": MODEL, "tokens": bare.json()["tokens"]})
    assert back.status_code == 200 and back.json()["prompt"] == text


def test_tokenize_messages_equals_the_chat_prompt(served: tuple[str, EngineCore]) -> None:
    url, engine = served
    got = post(url, "/tokenize", {"messages": MESSAGES}).json()
    text = engine.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert got["tokens"] == engine.tokenizer.encode(text, add_special_tokens=False)
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1, "temperature": 0}
    usage = post(url, "/v1/chat/completions", chat).json()["usage"]
    assert usage["prompt_tokens"] == got["count"]
    bare = post(url, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert bare["count"] < got["count"] and got["tokens"][: bare["count"]] == bare["tokens"]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/tokenize", {"messages": MESSAGES, "model": "other"}, 404, "model"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"prompt": "\ud800"}, 400, "prompt"),
        ("/tokenize", [1, 2], 400, None),
        ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
    ],
)
def test_bad_bodies_are_refused_naming_the_field(
    served: tuple[str, EngineCore], path: str, body: object, status: int, param: str | None
) -> None:
    url, _ = served
    r = post(url, path, body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
    assert post(url, "/tokenize", {"prompt": "still serving"}).status_code == 200


def test_both_need_the_api_key(served: tuple[str, EngineCore]) -> None:
    url, _ = served
    for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
        assert httpx.post(url + path, json=body, timeout=60).status_code == 401

"""Issue 13's acceptance through the real server (``hybridkv serve`` on tiny Granite 4.0-H):
the first request that shares a prefix hits it when a state checkpoint was kept there —
named by the caller (``cache_boundaries``) or at the end of a chat message — and outputs equal
a run with prefix caching off. A ``cache_boundaries`` that is not a list of non-negative
integers is a 400 in OpenAI's error shape."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hybridkv.chat_boundaries import message_boundaries
from tests.server.harness import SubprocessServer
from tests.support.lifetimes import track

pytestmark = pytest.mark.slow

FLAGS = ["--kv-cache-memory", "64MiB", "--max-num-seqs", "8", "--seed", "0"]
BLOCK = 16  # the server's default block size


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    with SubprocessServer(
        ["--model", str(model_dir), "--served-model-name", "m", *FLAGS], log
    ) as s:
        yield s


@pytest.fixture(scope="module")
def plain(model_dir: Path) -> Any:
    """The same engine with prefix caching off: the outputs to match."""
    from hybridkv import LLM

    return track(LLM(str(model_dir), kv_cache_memory="64MiB", seed=0, enable_prefix_caching=False))


def _post(server: SubprocessServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": "m", **body}, timeout=120)


def _complete(server: SubprocessServer, prompt: list[int], **extra: Any) -> dict[str, Any]:
    r = _post(
        server, "/v1/completions", {"prompt": prompt, "max_tokens": 6, "temperature": 0, **extra}
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def _cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def _ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 900) for _ in range(n)]


def _greedy(plain: Any, prompt: Any) -> str:
    from hybridkv import SamplingParams

    (out,) = plain.generate([prompt], SamplingParams(max_tokens=6, temperature=0), use_tqdm=False)
    return str(out.text)


def test_first_sharer_hits_a_caller_boundary(server: SubprocessServer, plain: Any) -> None:
    first = _ids(1, 400)
    a = _complete(server, first, cache_boundaries=[64])
    follow = first[:64] + _ids(2, 100)
    b = _complete(server, follow)
    assert _cached(a) == 0
    assert _cached(b) >= 48
    assert _cached(b) == 64
    for prompt, answer in ((first, a), (follow, b)):
        assert answer["choices"][0]["text"] == _greedy(plain, prompt)


def test_without_the_boundary_the_first_sharer_misses(server: SubprocessServer) -> None:
    """Control: the same shapes with no boundary named hit nothing (interval 512, prompt ends
    at 384/400, no junction yet)."""
    first = _ids(3, 400)
    _complete(server, first)
    assert _cached(_complete(server, first[:64] + _ids(4, 100))) == 0


def test_boundaries_in_any_order_rounded_down_outside_ignored(server: SubprocessServer) -> None:
    first = _ids(5, 200)
    _complete(server, first, cache_boundaries=[5000, 100, 0, 40])  # 100 -> 96, 40 -> 32
    assert _cached(_complete(server, first[:100] + _ids(6, 50))) == 96
    assert _cached(_complete(server, first[:45] + _ids(7, 50))) == 32


def test_chat_hits_the_system_prompt_the_first_time(server: SubprocessServer, plain: Any) -> None:
    words = [
        "the",
        "model",
        "keeps",
        "a",
        "state",
        "for",
        "every",
        "layer",
        "and",
        "the",
        "cache",
        "holds",
        "blocks",
        "of",
        "keys",
    ]
    rng = random.Random(8)
    system = {"role": "system", "content": " ".join(rng.choice(words) for _ in range(80))}
    first = [system, {"role": "user", "content": "what is a block of the cache"}]
    second = [system, {"role": "user", "content": "and how long does a state live"}]
    tok = plain.tokenizer
    prompt = tok.encode(tok.apply_chat_template(second, add_generation_prompt=True))
    system_end = message_boundaries(tok, second, prompt)[0]
    assert 96 <= system_end < len(prompt)
    answers = []
    for messages in (first, second):
        body = {"messages": messages, "max_tokens": 6, "temperature": 0}
        r = _post(server, "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        answers.append(r.json())
    assert _cached(answers[0]) == 0
    assert _cached(answers[1]) == system_end // BLOCK * BLOCK
    for messages, answer in zip((first, second), answers, strict=True):
        (ref,) = plain.chat(messages, _params(), use_tqdm=False)
        assert answer["choices"][0]["message"]["content"] == ref.text


def _params() -> Any:
    from hybridkv import SamplingParams

    return SamplingParams(max_tokens=6, temperature=0)


@pytest.mark.parametrize("bad", ["64", [-1], [1.5], [True], {"a": 1}, [[64]], 64])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_bad_cache_boundaries_are_a_400(server: SubprocessServer, path: str, bad: Any) -> None:
    body: dict[str, Any] = {"max_tokens": 2, "cache_boundaries": bad}
    if path == "/v1/completions":
        body["prompt"] = [5, 6, 7]
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "cache_boundaries"
    assert "cache_boundaries" in error["message"]

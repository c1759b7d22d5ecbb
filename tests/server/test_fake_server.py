"""The server over a fake engine (no model): HTTP shapes, errors, threads, disconnects.

One uvicorn server per module, in a thread; the official openai client talks to it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from hybridkv.metrics.prometheus import ServerMetrics
from hybridkv.server.app import create_app
from hybridkv.server.async_engine import AsyncEngine
from hybridkv.server.state import ServerState
from tests.server.fake_engine import FakeEngine, expected_text
from tests.server.harness import ThreadedServer, scrape, wait_for

MODEL = "fake-model"


def make_app(api_key: str | None = None, **engine_kw: object) -> tuple[object, FakeEngine]:
    fake = FakeEngine(**engine_kw)  # type: ignore[arg-type]
    metrics = ServerMetrics()
    engine = AsyncEngine(fake, metrics)  # type: ignore[arg-type]
    state = ServerState(engine, metrics, fake.tokenizer, MODEL, fake.max_model_len)
    return create_app(state, api_key), fake


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ThreadedServer, FakeEngine]]:
    app, fake = make_app(step_delay=0.002)
    with ThreadedServer(app) as server:
        yield server, fake


@pytest.fixture(scope="module")
def long_served() -> Iterator[tuple[ThreadedServer, FakeEngine]]:
    """Room for requests that run until their client goes away (max_tokens within context)."""
    app, fake = make_app(step_delay=0.002, max_model_len=1 << 20)
    with ThreadedServer(app) as server:
        yield server, fake


@pytest.fixture
def client(served: tuple[ThreadedServer, FakeEngine]) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[0].url + "/v1", api_key="unused", max_retries=0)


def post(served: tuple[ThreadedServer, FakeEngine], path: str, **kw: object) -> httpx.Response:
    return httpx.post(served[0].url + path, timeout=30, **kw)  # type: ignore[arg-type]


def test_completion(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="abc", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.model == MODEL
    assert r.choices[0].text == expected_text("abc", 5) == "defgh"
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (3, 5, 8)
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_completion_from_token_ids_and_default_max_tokens(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt=[ord("x")])
    assert r.choices[0].text == expected_text("x", 16)  # OpenAI's default max_tokens


def test_completion_stream_with_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL, prompt="k", max_tokens=7, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == expected_text("k", 7)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 7


def test_stop_string_is_not_streamed(client: openai.OpenAI) -> None:
    """Held-back text: the stop string 'ef' must not leak out as a streamed 'e'."""
    kw = dict(model=MODEL, prompt="a", max_tokens=10, stop=["ef", "zz"])
    whole = client.completions.create(**kw)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True))  # type: ignore[call-overload]
    assert whole.choices[0].text == streamed == "bcd"
    assert whole.choices[0].finish_reason == "stop"


def test_chat(client: openai.OpenAI) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4)  # type: ignore[arg-type]
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected_text(">", 4)  # template ends "<assistant>"
    assert r.usage.prompt_tokens == len("<user>hi<assistant>")


def test_chat_stream_and_logprobs(client: openai.OpenAI) -> None:
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}
    ]
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=msgs,
            max_completion_tokens=3,
            stream=True,
            logprobs=True,  # type: ignore[arg-type]
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "abc"
    tokens = [
        t.token for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ]
    assert tokens == ["a", "b", "c"]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completion_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="a", max_tokens=3, logprobs=0)
    lp = r.choices[0].logprobs
    assert lp.tokens == ["b", "c", "d"] and lp.token_logprobs == [-0.5] * 3
    assert lp.text_offset == [0, 1, 2]


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


BAD_REQUESTS = [
    # (path, raw body or JSON, status, param)
    ("/v1/completions", b'{"model": "fake-model", "prompt": ', 400, None),
    ("/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("/v1/completions", {"prompt": "a"}, 400, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": {"a": 1}}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"model": "other", "prompt": "a"}, 404, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "a" * 64}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "temperature": -1}, 400, "temperature"),
    (
        "/v1/completions",
        {"model": MODEL, "prompt": "a", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),  # fmt: skip
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"content": "x"}]},
        400,
        "messages.0.role",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x" * 80}]},
        400,
        "messages",
    ),  # fmt: skip
    ("/v1/nothing", {}, 404, None),
    # hostile values (issue 18): no coercion, finite numbers, valid Unicode, bounded lists
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": True}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "top_p": "0.5"}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "stream": 1}, 400, "stream"),
    (
        "/v1/completions",
        b'{"model": "fake-model", "prompt": "a", "temperature": Infinity}',
        400,
        "temperature",
    ),  # fmt: skip
    ("/v1/completions", b'{"model": "fake-model", "prompt": "a", "top_p": NaN}', 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "logprobs": -1}, 400, "logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 64}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "stop": ["x"] * 65}, 400, "stop"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "cache_salt": ""}, 400, "cache_salt"),
    ("/v1/completions", b'{"model": "fake-model", "prompt": "a\\ud800b"}', 400, "prompt"),
    (
        "/v1/chat/completions",
        b'{"model": "fake-model", "messages": [{"role": "user", "content": "\\ud800"}]}',
        400,
        "messages",
    ),  # fmt: skip
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": -2},
        400,
        "top_logprobs",
    ),  # fmt: skip
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 100},
        400,
        "max_tokens",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS)
def test_bad_requests(served, client, path, body, status, param) -> None:  # noqa: ANN001
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}  # fmt: skip
    r = post(served, path, **kw)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    # ... and the server keeps serving
    assert client.completions.create(model=MODEL, prompt="a", max_tokens=1).choices[0].text == "b"


def test_errors_reach_the_openai_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="a")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="a", max_tokens=0)


def test_engine_calls_stay_on_the_engine_thread(served, client) -> None:  # noqa: ANN001
    client.completions.create(model=MODEL, prompt="a", max_tokens=2)
    assert served[1].threads == {"hybridkv-engine"}


def test_stream_disconnect_aborts(long_served) -> None:  # noqa: ANN001
    server, fake = long_served
    body = {"model": MODEL, "prompt": "a", "max_tokens": 10_000, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [json.loads(x[6:]) for x in (next(lines), next(lines), next(lines)) if x.startswith("data: ")]  # fmt: skip
        assert got and scrape(server.url)["vllm:num_requests_running"] == 1
    wait_for(lambda: not fake.reqs, what="the aborted request to leave the engine")
    wait_for(lambda: scrape(server.url)["vllm:num_requests_running"] == 0, what="metrics")
    m = scrape(server.url)
    assert m["vllm:kv_cache_usage_perc"] == 0.0
    assert m["vllm:request_success_total{finished_reason=abort}"] >= 1


def test_non_stream_disconnect_aborts(long_served) -> None:  # noqa: ANN001
    server, fake = long_served
    body = {"model": MODEL, "prompt": "a", "max_tokens": 100_000}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.5)
    wait_for(lambda: not fake.reqs, what="the aborted request to leave the engine")


def test_metrics(served, client) -> None:  # noqa: ANN001
    client.completions.create(model=MODEL, prompt="abcd", max_tokens=3)
    m = scrape(served[0].url)
    assert m["vllm:request_success_total{finished_reason=length}"] >= 1
    assert m["vllm:generation_tokens_total"] >= 3
    assert m["vllm:time_to_first_token_seconds_count"] >= 1
    assert m["vllm:e2e_request_latency_seconds_count"] >= 1
    assert m["hybridkv:group_prefix_cache_queries_total{group=0,kind=full_attention}"] >= 4
    assert m["hybridkv:cached_prompt_tokens_total{source=peer}"] == 0
    assert m["hybridkv:offload_bytes_total{direction=store,tier=disk}"] == 0
    assert "hybridkv:kv_load_failures" not in m  # no samples until a connector reports


def test_api_key() -> None:
    app, _ = make_app(api_key="sesame")
    with ThreadedServer(app) as server:
        base = server.url + "/v1"
        bad = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        r = httpx.post(base + "/completions", content=b"{not json")  # auth is checked first
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        good = openai.OpenAI(base_url=base, api_key="sesame", max_retries=0)
        assert good.completions.create(model=MODEL, prompt="a", max_tokens=1).choices[0].text == "b"
        assert httpx.get(server.url + "/health").status_code == 200  # probes need no key


def test_request_error_mid_stream(client: openai.OpenAI) -> None:
    """A request the engine fails (after a token was streamed) ends with an error event."""
    with pytest.raises(openai.InternalServerError, match="KV load failed"):
        client.completions.create(model=MODEL, prompt="FAIL", max_tokens=5)
    stream = client.completions.create(model=MODEL, prompt="FAIL", max_tokens=5, stream=True)
    with pytest.raises(openai.APIError, match="KV load failed"):
        list(stream)
    assert client.completions.create(model=MODEL, prompt="a", max_tokens=1).choices[0].text == "b"


def test_engine_crash_gives_503() -> None:
    app, _ = make_app()
    with ThreadedServer(app) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError) as crashed:
            client.completions.create(model=MODEL, prompt="CRASH", max_tokens=3)
        assert crashed.value.status_code == 503
        assert "fake engine crashed" in crashed.value.message
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "engine_unavailable"
        with pytest.raises(openai.InternalServerError) as refused:
            client.completions.create(model=MODEL, prompt="a", max_tokens=1)
        assert refused.value.status_code == 503


def test_unexpected_error_is_an_openai_500(served) -> None:  # noqa: ANN001
    r = post(served, "/v1/completions", json={"model": MODEL, "prompt": "BUG"})
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal_error"
    assert "a bug in the tokenizer" in r.json()["error"]["message"]
    assert post(served, "/v1/completions", json={"model": MODEL, "prompt": "a"}).status_code == 200


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_kv_transfer_params_in_and_out(
    served: tuple[ThreadedServer, FakeEngine], path: str
) -> None:
    """kv_transfer_params go to the engine and come back at the top level of the response,
    and in the last streamed chunk only."""
    sent = {"do_remote_decode": True}
    body: dict[str, object] = {"model": MODEL, "max_tokens": 3, "kv_transfer_params": sent}
    body.update({"prompt": "abc"} if "chat" not in path else {"messages": [
        {"role": "user", "content": "abc"}]})  # fmt: skip
    r = post(served, path, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["kv_transfer_params"] == {"echo": sent}
    plain = post(served, path, json={k: v for k, v in body.items() if k != "kv_transfer_params"})
    assert plain.json()["kv_transfer_params"] is None
    r = post(served, path, json={**body, "stream": True})
    events = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
    assert [e.get("kv_transfer_params") for e in events][-1] == {"echo": sent}
    assert all("kv_transfer_params" not in e for e in events[:-1])

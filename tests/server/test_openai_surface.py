"""What a vLLM user sends, through the official openai client against a real ``hybridkv serve``
(tiny random hybrid): lists of prompts, ``n``, ``echo`` with prompt logprobs, top logprobs,
structured outputs, unknown fields, chat template options, and OpenAI's error shapes."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.server.harness import SubprocessServer, wait_for
from tests.support.lifetimes import track

pytestmark = pytest.mark.slow

ENGINE = ["--kv-cache-memory", "64MiB", "--max-num-seqs", "16", "--seed", "0"]
NAME = "tiny"
PROMPTS = ["The key to a fast inference engine is", "Once upon a time"]


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubprocessServer]:
    log = tmp_path_factory.mktemp("server") / "server.log"
    with SubprocessServer([str(model_dir), "--served-model-name", NAME, *ENGINE], log) as srv:
        yield srv


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> Any:
    from hybridkv import LLM

    return track(LLM(str(model_dir), kv_cache_memory="64MiB", max_num_seqs=16, seed=0))


@pytest.fixture(scope="module")
def client(server: SubprocessServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def greedy(**kw: Any) -> Any:
    from hybridkv import SamplingParams

    return SamplingParams(temperature=0.0, **kw)


def test_list_of_prompts_and_token_ids(client: openai.OpenAI, llm: Any) -> None:
    want = [o.text for o in llm.generate(PROMPTS, greedy(max_tokens=6), use_tqdm=False)]
    r = client.completions.create(model=NAME, prompt=PROMPTS, max_tokens=6, temperature=0)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == want
    ids = [llm.get_tokenizer().encode(p) for p in PROMPTS]
    r = client.completions.create(model=NAME, prompt=ids, max_tokens=6, temperature=0)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == want
    stream = client.completions.create(model=NAME, prompt=PROMPTS, max_tokens=6, temperature=0,
                                       stream=True)  # fmt: skip
    texts = ["", ""]
    for c in stream:
        for choice in c.choices:
            texts[choice.index] += choice.text
    assert texts == want


def test_n_choices_share_the_prompt(client: openai.OpenAI, llm: Any) -> None:
    prompt = " ".join(f"w{i}" for i in range(40))
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=8, n=4, seed=1,
                                  temperature=1.0)  # fmt: skip
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert len({c.text for c in r.choices}) > 1  # sampled independently
    assert 4 <= r.usage.completion_tokens <= 32
    assert r.usage.prompt_tokens == len(llm.get_tokenizer().encode(prompt))  # counted once
    chat = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4, n=2, temperature=0)  # fmt: skip
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content  # greedy


def test_best_of_keeps_the_most_likely(client: openai.OpenAI) -> None:
    kw: Any = {"model": NAME, "prompt": PROMPTS[1], "max_tokens": 4, "seed": 5}
    every = client.completions.create(n=3, logprobs=0, **kw).choices
    best = client.completions.create(best_of=3, **kw).choices
    assert len(best) == 1 and best[0].logprobs is None
    totals = {c.text: sum(c.logprobs.token_logprobs) for c in every}
    assert best[0].text == max(totals, key=lambda t: totals[t])


def test_echo_prompt_logprobs_equal_llm_generate(client: openai.OpenAI, llm: Any) -> None:
    prompt = PROMPTS[0]
    want = llm.generate([prompt], greedy(max_tokens=1, prompt_logprobs=1), use_tqdm=False)[0]
    ids = want.prompt_token_ids
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=1, temperature=0,
                                  echo=True, logprobs=1)  # fmt: skip
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(prompt)
    assert len(lp.token_logprobs) == len(ids) + 1 and lp.token_logprobs[0] is None
    for i in range(1, len(ids)):
        assert math.isclose(lp.token_logprobs[i], want.prompt_logprobs[i][ids[i]].logprob,
                            abs_tol=1e-5)  # fmt: skip
        assert max(lp.top_logprobs[i].values()) >= lp.token_logprobs[i]


def test_top_logprobs(client: openai.OpenAI, llm: Any) -> None:
    messages: Any = [{"role": "user", "content": "Say something."}]
    want = llm.chat(messages, greedy(max_tokens=5, logprobs=3), use_tqdm=False)[0]
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=5,
                                       temperature=0, logprobs=True, top_logprobs=3)  # fmt: skip
    content = r.choices[0].logprobs.content
    assert len(content) == len(want.token_ids)
    for entry, token_id, alternatives in zip(content, want.token_ids, want.outputs[0].logprobs,
                                             strict=True):  # fmt: skip
        assert math.isclose(entry.logprob, alternatives[token_id].logprob, abs_tol=1e-5)
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
    r = client.completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=4, temperature=0,
                                  logprobs=2)  # fmt: skip
    assert all(len(top) in (2, 3) for top in r.choices[0].logprobs.top_logprobs)


def test_structured_outputs(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "ok?"}],
                                       max_tokens=40, temperature=0, response_format=fmt)  # fmt: skip
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content or "")["ok"], bool)
    r = client.completions.create(model=NAME, prompt="Pick:", max_tokens=10, temperature=0.8,
                                  seed=3, extra_body={"structured_outputs": {"choice": ["red", "green"]}})  # fmt: skip
    assert r.choices[0].text in ("red", "green")


def test_unknown_fields_and_template_kwargs(
    client: openai.OpenAI, server: SubprocessServer
) -> None:
    extra = {
        "store": True,
        "metadata": {"a": "b"},
        "chat_template_kwargs": {"enable_thinking": False},
    }
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, extra_body=extra)  # fmt: skip
    assert r.choices[0].message.content is not None
    wait_for(lambda: "['metadata', 'store'] are not used" in server.log(), what="the warning")
    parts: Any = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert client.chat.completions.create(model=NAME, messages=parts, max_tokens=2).choices


ERRORS = [
    # (path, body, status, param)
    ("/v1/completions", {"prompt": "a", "max_tokens": "x"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "a", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "a", "n": 2, "best_of": 1}, 400, "best_of"),
    ("/v1/completions", {"prompt": "a", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {}, 400, "prompt"),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "a"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "auto",
        },
        400,
        "tool_choice",
    ),  # fmt: skip
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("path", "body", "status", "param"), ERRORS)
def test_errors_have_openai_shape(
    server: SubprocessServer, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    r = httpx.post(server.url + path, json={"model": NAME, **body}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert f"refused POST {path}: 400" in server.log()


def test_openai_client_raises_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "a"}],
                                       top_logprobs=2)  # fmt: skip
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="a")

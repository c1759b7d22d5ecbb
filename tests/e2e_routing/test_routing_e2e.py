"""KV-aware routing with real processes: three ``hybridkv serve`` engines (the embedded tiny
hybrid: a full-attention group and a Mamba state group) publishing KV events, one
``hybridkv proxy --routing cost`` subscribed to them. One set of processes for the module.

- a conversation's second turn lands on the first turn's engine and hits;
- a salted request never routes by another salt's blocks;
- an engine whose attention blocks are cached but whose state checkpoint was evicted is
  predicted a miss (an attention-only index would over-predict);
- an engine killed and restarted: its index is dropped, re-synced from its new events, and
  routing resumes on it;
- P/D (the engines are ``kv_both``; a second proxy makes engine 0 the prefill engine): a
  prompt the decode engine already holds skips the prefill engine, with the same output.
- ``/reset_prefix_cache`` on an engine: the running proxy and one started after the reset
  (its index replayed from the engine's buffer, the blocks before the reset included)
  predict 0 for it, and it hits 0.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e_pd.harness import ProxyProcess, nixl_config
from tests.server.harness import SubprocessServer, free_port, scrape
from tests.support.served import serve_all

B = 16  # the engines' block size
PREDICT = "/v1/routing/predict"


@dataclass
class Fleet:
    engines: list[SubprocessServer]
    proxy: ProxyProcess
    tmp: Path


def engine_args(tmp: Path, i: int) -> list[str]:
    events = {
        "enable_kv_cache_events": True,
        "endpoint": f"ipc://{tmp}/events{i}",
        "replay_endpoint": f"ipc://{tmp}/replay{i}",
        "topic": "kv",
    }
    return ["--served-model-name", "m", "--kv-cache-memory", "32MiB", "--max-num-seqs", "2",
            "--num-state-slots", "5", "--kv-events-config", json.dumps(events),
            "--kv-transfer-config", nixl_config("kv_both", free_port())]  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("routing")
    with ExitStack() as stack:
        engines = [SubprocessServer(engine_args(tmp, i), tmp / f"e{i}.log") for i in range(3)]

        def stop_engines() -> None:  # the list's engines at the end (a test restarts one)
            for e in engines:
                e.__exit__()

        stack.callback(stop_engines)
        serve_all(stack, engines)  # NOTE: from this thread: an engine dies with its starting thread
        proxy = ProxyProcess([], [e.url for e in engines], tmp / "proxy.log")
        proxy.cmd += ["--routing", "cost", "--health-interval", "0.5", "--health-timeout", "5"]
        stack.enter_context(proxy)
        fleet = Fleet(engines, proxy, tmp)
        wait_until(lambda: all(n > 0 for n in predict(fleet, [1] * 40)["order_indexed"]))
        yield fleet


def predict(
    fleet: Fleet, prompt: list[int], proxy: str | None = None, **body: Any
) -> dict[str, Any]:
    url = proxy or fleet.proxy.url
    r = httpx.post(url + PREDICT, json={"model": "m", "prompt": prompt, **body})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    # which engines are indexed: those with a prediction at all
    out["order_indexed"] = [int(u in out["predicted_cached_tokens"]) for u in out["order"]]
    return out


def complete(url: str, prompt: list[int], **body: Any) -> dict[str, Any]:
    payload = {"model": "m", "prompt": prompt, "max_tokens": 2, "temperature": 0, **body}
    r = httpx.post(url + "/v1/completions", json=payload, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


def wait_until(ok: Any, timeout: float = 30.0, why: Any = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out {why()}"
        time.sleep(0.1)


def holder(fleet: Fleet, prompt: list[int], at_least: int, **body: Any) -> str:
    """The engine the proxy predicts holds ``prompt`` (waits for the events)."""
    found: list[str] = []

    def seen() -> bool:
        predicted = predict(fleet, prompt, **body)["predicted_cached_tokens"]
        found[:] = [u for u, n in predicted.items() if n >= at_least]
        return bool(found)

    wait_until(seen)
    return found[0]


def prediction_counts(fleet: Fleet) -> dict[str, float]:
    metrics = scrape(fleet.proxy.url)
    return {
        result: sum(v for k, v in metrics.items() if "predictions_total" in k and result in k)
        for result in ("exact", "over", "under")
    }


def prompt_of(seed: int, n: int) -> list[int]:
    return [(seed * 131 + i * 7) % 900 + 20 for i in range(n)]


def test_a_second_turn_lands_on_the_first_turns_engine_and_hits(fleet: Fleet) -> None:
    for c in range(3):  # three conversations: a lucky round robin would be 1/27
        turn1 = prompt_of(c, 3 * B + 5)
        complete(fleet.proxy.url, turn1)
        engine = holder(fleet, [*turn1, 1], 3 * B)
        turn2 = [*turn1, *prompt_of(100 + c, 2 * B)]
        before = prediction_counts(fleet)
        assert predict(fleet, turn2)["order"][0] == engine
        answer = complete(fleet.proxy.url, turn2)
        assert cached(answer) >= (len(turn1) // B) * B
        after = prediction_counts(fleet)
        assert after["exact"] == before["exact"] + 1 and after["over"] == before["over"]


def test_a_salted_request_never_routes_by_another_salts_blocks(fleet: Fleet) -> None:
    prompt = prompt_of(7, 4 * B + 3)
    complete(fleet.proxy.url, prompt, cache_salt="tenant-a")
    holder(fleet, prompt, 4 * B, cache_salt="tenant-a")
    other = predict(fleet, prompt, cache_salt="tenant-b")
    assert set(other["predicted_cached_tokens"].values()) == {0}
    assert other["reason"] == "load"
    plain = predict(fleet, prompt)
    assert set(plain["predicted_cached_tokens"].values()) == {0}
    assert cached(complete(fleet.proxy.url, prompt, cache_salt="tenant-b")) == 0
    assert cached(complete(fleet.proxy.url, prompt, cache_salt="tenant-a")) == 4 * B


def test_attention_cached_but_checkpoint_evicted_is_predicted_a_miss(fleet: Fleet) -> None:
    prompt = prompt_of(11, 4 * B + 3)
    complete(fleet.proxy.url, prompt)
    url = holder(fleet, prompt, 4 * B)
    # longer prompts on the same engine take its few state slots (each checkpoint saves more
    # work, so the scan-resistant book lets it displace the shorter one): the checkpoints go,
    # the attention blocks (32 MiB of them) stay
    for i in range(6):
        complete(url, prompt_of(500 + i, 8 * B + 1))
    wait_until(lambda: predict(fleet, prompt)["predicted_cached_tokens"][url] == 0)
    before = scrape(url)
    answer = complete(url, prompt)  # straight to the engine: what does it hold?
    after = scrape(url)
    assert cached(answer) == 0  # a miss: no checkpoint to resume the state from
    attention = [k for k in after if "prefix_cache_hits" in k and "full_attention" in k]
    assert attention and any(after[k] - before.get(k, 0) >= 4 * B for k in attention)


def test_a_killed_and_restarted_engine_is_resynced_and_routed_to_again(fleet: Fleet) -> None:
    prompt = prompt_of(21, 3 * B + 2)
    complete(fleet.proxy.url, prompt)
    url = holder(fleet, prompt, 3 * B)
    i = [e.url for e in fleet.engines].index(url)
    old = fleet.engines[i]
    assert old.proc is not None
    old.proc.kill()  # SIGKILL: no goodbye on its event stream
    old.proc.wait()
    old.__exit__()
    new = SubprocessServer(engine_args(fleet.tmp, i), fleet.tmp / f"e{i}-restarted.log")
    new.port, new.url = old.port, old.url
    new.cmd[-1] = str(old.port)  # the same address: the proxy knows it by its URL
    fleet.engines[i] = new.__enter__()
    # its index was dropped when it went down: nothing is predicted from the old process
    wait_until(lambda: predict(fleet, prompt)["predicted_cached_tokens"].get(url, -1) == 0)
    complete(url, prompt)  # the new process caches it again: its new events say so
    assert holder(fleet, [*prompt, 5], 3 * B) == url
    # first once the proxy's /health probe saw it back (every 0.5 s here)
    wait_until(lambda: predict(fleet, [*prompt, 5])["order"][0] == url)
    answer = complete(fleet.proxy.url, [*prompt, 5])
    assert cached(answer) >= 3 * B


def test_a_reset_engine_is_predicted_empty_by_a_running_and_a_late_proxy(fleet: Fleet) -> None:
    prompt = prompt_of(41, 4 * B + 3)
    complete(fleet.proxy.url, prompt)
    url = holder(fleet, prompt, 4 * B)
    assert httpx.post(url + "/reset_prefix_cache", timeout=60).status_code == 200
    wait_until(lambda: predict(fleet, prompt)["predicted_cached_tokens"][url] == 0)
    late = ProxyProcess([], [e.url for e in fleet.engines], fleet.tmp / "late-proxy.log")
    late.cmd += ["--routing", "cost"]
    with late:  # B7's fresh proxy per policy (issue 28)
        wait_until(lambda: all(predict(fleet, [1] * 40, late.url)["order_indexed"]))
        assert predict(fleet, prompt, late.url)["predicted_cached_tokens"][url] == 0
    assert cached(complete(url, prompt)) == 0


def test_pd_skips_the_prefill_engine_when_the_decode_engine_holds_the_prompt(
    fleet: Fleet,
) -> None:
    prefill, decode = fleet.engines[0], fleet.engines[1:]
    pd = ProxyProcess([prefill.url], [e.url for e in decode], fleet.tmp / "pd-proxy.log")
    pd.cmd += ["--routing", "cost", "--prefill-skip-tokens", str(B)]
    with pd:
        wait_until(lambda: all(predict(fleet, [1] * 40, pd.url)["order_indexed"]))
        prompt = prompt_of(31, 5 * B + 1)
        first = complete(pd.url, prompt, max_tokens=6)
        outcomes = scrape(pd.url)
        assert outcomes["hybridkv_proxy_requests_total{outcome=disaggregated}"] == 1
        # NOTE: whether a decode engine that *loaded* the prompt also holds a state
        # checkpoint at a block end is the engine's business (its events say, the router
        # follows); one that computed the prompt itself surely holds both
        complete(decode[0].url, prompt, max_tokens=6)
        found: list[int] = []

        def held() -> bool:
            found[:] = list(predict(fleet, prompt, pd.url)["predicted_cached_tokens"].values())
            return max(found) >= len(prompt) - 1

        wait_until(held, 10.0, lambda: f"predicted {found}")
        again = complete(pd.url, prompt, max_tokens=6)
        outcomes = scrape(pd.url)
        assert outcomes["hybridkv_proxy_requests_total{outcome=prefill_skipped}"] == 1
        assert outcomes["hybridkv_proxy_requests_total{outcome=disaggregated}"] == 1
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert cached(again) == max(found)


def chat(url: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": "m", "messages": messages, "max_tokens": 3, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def predict_chat(fleet: Fleet, messages: list[dict[str, str]]) -> dict[str, Any]:
    r = httpx.post(fleet.proxy.url + PREDICT, json={"model": "m", "messages": messages})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_chat_routes_on_its_rendered_prompt(fleet: Fleet) -> None:
    system = {"role": "system", "content": "You answer briefly and well. " * 12}
    turn1 = [system, {"role": "user", "content": "What is a recurrent state?"}]
    answer = chat(fleet.proxy.url, turn1)["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": answer},
             {"role": "user", "content": "And a checkpoint of it?"}]  # fmt: skip
    found: list[str] = []

    def held() -> bool:
        predicted = predict_chat(fleet, turn2)["predicted_cached_tokens"]
        found[:] = [u for u, n in predicted.items() if n >= 2 * B]
        return bool(found)

    wait_until(held)
    decision = predict_chat(fleet, turn2)
    assert decision["order"][0] == found[0] and decision["reason"] == "cache_hit"
    before = prediction_counts(fleet)
    second = chat(fleet.proxy.url, turn2)
    assert cached(second) == decision["predicted_cached_tokens"][found[0]]
    assert prediction_counts(fleet)["exact"] == before["exact"] + 1

"""1P1D and 2P2D behind ``hybridkv proxy``: greedy outputs equal a colocated engine's, streamed
and not, on a sliding-window Qwen3, Gemma 3 and Granite 4.0-H (Mamba2 state)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from hybridkv import LLM, SamplingParams
from tests.e2e_pd.harness import (
    ProxyProcess,
    complete,
    deploy,
    engine,
    stream_tokens_text,
)
from tests.engine.helpers import random_ids
from tests.server.harness import free_port, scrape
from tests.support.served import serve_all

# shorter than a block, around blocks and the window (32), long, several thousand tokens
LENGTHS = [3, 15, 16, 17, 31, 33, 40, 64, 65, 100, 130, 257, 400, 700, 1000, 2500]
MAX_TOKENS = 6


def reference(model: Path, prompts: list[list[int]]) -> list[str]:
    llm = LLM(str(model), dtype="float32", kv_cache_memory="64MiB")
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    return [o.text for o in outs]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("arch", ["qwen3"])
def test_1p1d_equals_colocated(arch: str, checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    """The smallest deployment. Gemma 3 and Granite 4.0-H (window, Mamba2 state) run the same
    prompts, streamed and not, against colocated outputs in
    ``test_2p2d_round_robin_and_metrics`` (each of its four engines in one transfer or more)."""
    model = checkpoint(arch)
    prompts = [random_ids(n, 100 + n) for n in LENGTHS]
    expected = reference(model, prompts)
    d = deploy(model, tmp_path, 1, 1)
    with d.stack:
        for prompt, want in zip(prompts, expected, strict=True):
            body = complete(d.proxy.url, prompt, MAX_TOKENS)
            assert body["choices"][0]["text"] == want, len(prompt)
        for prompt, want in list(zip(prompts, expected, strict=True))[::5]:
            text, events = stream_tokens_text(d.proxy.url, prompt, MAX_TOKENS)
            assert text == want, len(prompt)
        decode, prefill = scrape(d.decode[0].url), scrape(d.prefill[0].url)
        routed = scrape(d.proxy.url)
        assert routed["hybridkv_proxy_requests_total{outcome=disaggregated}"] == len(prompts) + 4
        models = httpx.get(d.proxy.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["m"]
    assert decode and prefill


def metric(values: dict[str, float], name: str, **labels: str) -> float:
    key = ",".join(f"{k}={v}" for k, v in sorted({"connector": "NixlConnector", **labels}.items()))
    return values.get(f"hybridkv:{name}_total{{{key}}}", 0.0)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "granitemoehybrid"])
def test_2p2d_round_robin_and_metrics(
    arch: str, checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    """2 prefill + 2 decode engines (round robin on each side), the 16 prompts of the 1P1D
    test streamed and not: every engine takes part, outputs equal colocated ones, each decode
    engine's loaded bytes are what the prefill engines sent, decode engines report the
    transferred tokens as cached prompt tokens."""
    model = checkpoint(arch)
    prompts = [random_ids(n, 200 + n) for n in LENGTHS]
    expected = reference(model, prompts)
    d = deploy(model, tmp_path, 2, 2)
    with d.stack:
        for i, (prompt, want) in enumerate(zip(prompts, expected, strict=True)):
            if i % 2:
                text, _ = stream_tokens_text(d.proxy.url, prompt, MAX_TOKENS)
            else:
                body = complete(d.proxy.url, prompt, MAX_TOKENS)
                text = body["choices"][0]["text"]
                if len(prompt) >= 64:  # a whole block sent and read
                    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            assert text == want, len(prompt)
        sent = [metric(scrape(s.url), "kv_transfer_bytes", direction="send") for s in d.prefill]
        loaded = [metric(scrape(s.url), "kv_transfer_bytes", direction="load") for s in d.decode]
        assert all(x > 0 for x in sent + loaded) and sum(sent) == sum(loaded)
        handshakes = [metric(scrape(s.url), "kv_transfer_handshakes") for s in d.decode]
        assert sum(handshakes) >= 2 and all(h >= 1 for h in handshakes)  # cached per producer
        assert "hybridkv:num_requests_waiting_for_remote_kv" in scrape(d.decode[0].url)
        routed = scrape(d.proxy.url)
        assert routed["hybridkv_proxy_requests_total{outcome=disaggregated}"] == len(prompts)
        models = httpx.get(d.proxy.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["m"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_failed_prefill_engines_and_a_killed_producer(
    checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    """A dead prefill URL is skipped (retry on the next); a producer killed after handing out
    its params makes the decode engine recompute; with no prefill engine left the proxy
    serves colocated. Every answer equals the colocated one."""
    model = checkpoint("qwen3")
    prompts = [random_ids(n, 300 + n) for n in (40, 150, 260)]
    expected = reference(model, prompts)
    dead = f"http://127.0.0.1:{free_port()}"
    p = engine(model, tmp_path / "p.log", "kv_producer")
    dec = engine(model, tmp_path / "d.log", "kv_consumer", load_timeout_seconds=5.0)
    with ExitStack() as stack:
        serve_all(stack, [p, dec])
        proxy = stack.enter_context(ProxyProcess([dead, p.url], [dec.url], tmp_path / "proxy.log"))
        assert complete(proxy.url, prompts[0], MAX_TOKENS)["choices"][0]["text"] == expected[0]
        pre = complete(p.url, prompts[1], 1, kv_transfer_params={"do_remote_decode": True})
        assert p.proc is not None
        p.proc.kill()  # the producer dies holding the KV the decode engine is about to read
        p.proc.wait()
        body = complete(
            dec.url, prompts[1], MAX_TOKENS, kv_transfer_params=pre["kv_transfer_params"]
        )
        assert body["choices"][0]["text"] == expected[1]
        failures = scrape(dec.url)
        assert sum(v for k, v in failures.items() if "kv_transfer_failures" in k) >= 1
        assert complete(proxy.url, prompts[2], MAX_TOKENS)["choices"][0]["text"] == expected[2]
        routed = scrape(proxy.url)
        assert routed["hybridkv_proxy_requests_total{outcome=colocated}"] == 1
        # the dead URL failed a call, or a /health probe found it down first and it was skipped
        labels = f"{{engine={dead},role=prefill}}"
        assert routed.get(f"hybridkv_proxy_engine_failures_total{labels}", 0) >= 1 or (
            routed[f"hybridkv_proxy_engine_healthy{labels}"] == 0
        )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_other_weights_under_policy_fail_answer_an_error_over_http(
    checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    """A decode engine serving other weights refuses the producer's layout at the handshake.
    Under ``fail`` the completion answers 500 ``request_failed`` naming the reason (and a
    stream ends with an error event); the engine then serves its next request normally."""
    other = checkpoint("qwen3", name="qwen3-other", seed=1)
    prompt = random_ids(60, 7)
    expected = reference(other, [prompt])[0]
    p = engine(checkpoint("qwen3"), tmp_path / "p.log", "kv_producer")
    dec = engine(other, tmp_path / "d.log", "kv_consumer", policy="fail")
    with ExitStack() as stack:
        serve_all(stack, [p, dec])
        pre = complete(p.url, prompt, 1, kv_transfer_params={"do_remote_decode": True})
        body = {"model": "m", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        body["kv_transfer_params"] = pre["kv_transfer_params"]
        r = httpx.post(dec.url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 500, r.text
        error = r.json()["error"]
        assert error["code"] == "request_failed" and "nixl_incompatible" in error["message"]
        assert "weights" in error["message"] and "same checkpoint" in error["message"]
        assert "weights" in (tmp_path / "d.log").read_text()  # the log says it in words too
        again = complete(p.url, prompt, 1, kv_transfer_params={"do_remote_decode": True})
        body["kv_transfer_params"], body["stream"] = again["kv_transfer_params"], True
        streamed = httpx.post(dec.url + "/v1/completions", json=body, timeout=300)
        events = [x[6:] for x in streamed.text.split("\n\n") if x.startswith("data: {")]
        assert "request_failed" in events[-1] and "nixl_incompatible" in events[-1]
        assert complete(dec.url, prompt, MAX_TOKENS)["choices"][0]["text"] == expected
        assert metric(scrape(dec.url), "kv_transfer_failures", reason="nixl_incompatible") == 2

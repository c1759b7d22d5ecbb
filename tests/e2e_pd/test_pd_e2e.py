"""1P1D and 2P2D behind ``hybridkv proxy``: greedy outputs equal a colocated engine's, streamed
and not, on a sliding-window Qwen3, Gemma 3 and Granite 4.0-H (Mamba2 state)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from hybridkv import LLM, SamplingParams
from tests.e2e_pd.harness import complete, deploy, stream_tokens_text
from tests.engine.helpers import random_ids
from tests.server.harness import scrape

# shorter than a block, around blocks and the window (32), long, several thousand tokens
LENGTHS = [3, 15, 16, 17, 31, 33, 40, 64, 65, 100, 130, 257, 400, 700, 1000, 2500]
MAX_TOKENS = 6


def reference(model: Path, prompts: list[list[int]]) -> list[str]:
    llm = LLM(str(model), dtype="float32", kv_cache_memory="64MiB")
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    return [o.text for o in outs]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "granitemoehybrid"])
def test_1p1d_equals_colocated(arch: str, checkpoint: Callable[..., Path], tmp_path: Path) -> None:
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

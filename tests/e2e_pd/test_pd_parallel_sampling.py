"""``n > 1`` through ``hybridkv proxy`` (1P1D): the prompt's KV moves once (the first copy reads
the producer's lease; the others never read it again) and every copy gets it: the others hit
the decode engine's prefix cache for the prompt (on a state hybrid, the checkpoint kept where
the load wrote the state). No load fails, nothing is recomputed after a failed load, and the
producer pins nothing after the read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hybridkv import LLM, SamplingParams
from tests.e2e_pd.harness import complete, deploy
from tests.engine.helpers import random_ids
from tests.server.harness import scrape, wait_for

N = 3
MAX_TOKENS = 5


def failures(values: dict[str, float]) -> float:
    names = ("kv_load_failures", "kv_transfer_failures", "kv_transfer_leases_expired")
    return sum(v for k, v in values.items() if any(n in k for n in names))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("arch", ["qwen3", "granitemoehybrid"])
def test_n_copies_share_one_transfer(
    arch: str, checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    model = checkpoint(arch)
    prompts = [random_ids(n, 500 + n) for n in (40, 130)]
    llm = LLM(str(model), dtype="float32", kv_cache_memory="64MiB")
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    expected = [o.text for o in llm.generate(prompts, greedy, use_tqdm=False)]
    llm.close()
    d = deploy(model, tmp_path, 1, 1)
    with d.stack:
        for prompt, want in zip(prompts, expected, strict=True):
            body = complete(d.proxy.url, prompt, MAX_TOKENS, n=N)
            assert [c["text"] for c in body["choices"]] == [want] * N, len(prompt)
            cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
            whole_blocks = len(prompt) // 16 * 16  # every copy: at least the whole blocks
            assert cached >= N * whole_blocks, (len(prompt), cached)
        decode, prefill = scrape(d.decode[0].url), scrape(d.prefill[0].url)
        assert failures(decode) == 0 and failures(prefill) == 0
        assert decode["vllm:request_success_total{finished_reason=length}"] == len(prompts)
        # one transfer per request, not one per copy
        key = "hybridkv:kv_transfer_requests_total{connector=NixlConnector,direction=load}"
        assert decode[key] == len(prompts)
        # the producer holds nothing once the copies are served
        wait_for(lambda: scrape(d.prefill[0].url)["vllm:kv_cache_usage_perc"] == 0.0,
                 what="the producer to free its KV")  # fmt: skip

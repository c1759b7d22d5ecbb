"""Greedy generation through the whole engine equals transformers, token for token, with
logits within 1e-4 at every generated position (float32, every architecture).

Each configuration changes how the same prompts are cut into steps and blocks — one batch or
requests arriving while others run, prefix caching on or off, block size 16 or 8, a large or a
small token budget (chunked prefill) — and none of that may change a single token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.engine.helpers import (
    assert_matches_hf,
    assert_no_leaks,
    greedy,
    make_engine,
    make_llm,
    make_prompt_set,
    run_staggered,
)
from tests.support.checkpoints import HF_ARCHS

PROMPTS = make_prompt_set()

CONFIGS: dict[str, dict[str, Any]] = {
    "cache-bs16": {},
    "nocache-bs16": {"enable_prefix_caching": False},
    "cache-bs8-chunked": {"block_size": 8, "max_num_batched_tokens": 20},
    "nocache-bs8-chunked": {
        "block_size": 8,
        "max_num_batched_tokens": 20,
        "enable_prefix_caching": False,
    },
}


@pytest.mark.parametrize("config", ["cache-bs16", "nocache-bs16", "cache-bs8-chunked"])
@pytest.mark.parametrize("arch", HF_ARCHS)
def test_one_batch_matches_transformers(
    arch: str, config: str, checkpoints: dict[str, Path]
) -> None:
    model_dir = checkpoints[arch]
    llm = make_llm(model_dir, **CONFIGS[config])
    outs = llm.generate(PROMPTS, greedy(), use_tqdm=False)
    assert_matches_hf(model_dir, PROMPTS, outs, f"{arch}/{config}/batch")
    assert_no_leaks(llm.engine)


@pytest.mark.parametrize("config", [c for c in CONFIGS if c != "nocache-bs16"])
@pytest.mark.parametrize("arch", HF_ARCHS)
def test_requests_arriving_while_others_run_match_transformers(
    arch: str, config: str, checkpoints: dict[str, Path]
) -> None:
    model_dir = checkpoints[arch]
    engine = make_engine(model_dir, **CONFIGS[config])
    outs = run_staggered(engine, PROMPTS, greedy(), steps_between=3)
    assert_matches_hf(model_dir, PROMPTS, outs, f"{arch}/{config}/staggered")
    num_hit = sum(out.num_cached_tokens for out in outs)
    if engine.config.cache.enable_prefix_caching:
        assert num_hit > 0, "shared prefixes arrived late, yet nothing hit the cache"
    else:
        assert num_hit == 0
    assert_no_leaks(engine)


def test_abort_while_others_run_leaves_them_unchanged(checkpoints: dict[str, Path]) -> None:
    model_dir = checkpoints["granitemoehybrid"]
    engine = make_engine(model_dir, max_num_batched_tokens=24)
    keep = [PROMPTS[3], PROMPTS[1]]
    reqs = [engine.add_request(p, greedy()) for p in (PROMPTS[3], PROMPTS[2], PROMPTS[1])]
    engine.step()
    engine.step()  # the middle request is part-way through its prefill
    engine.abort_request(reqs[1].request_id)
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    aborted = final.pop(reqs[1].request_id)
    assert aborted.finish_reason == "abort"
    assert_matches_hf(model_dir, keep, [final[r.request_id] for r in (reqs[0], reqs[2])], "abort")
    assert_no_leaks(engine)

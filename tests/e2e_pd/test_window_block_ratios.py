"""Mixed block sizes on a sliding-window model through real processes: a producer
``hybridkv serve --block-size 16``, a consumer with blocks 4x and 8x larger, and the proxy.

Prompts of 300-700 ids go through the proxy; then requests sent to the decode engine share a
block-multiple prefix of them plus 40 new ids. Every answer must be a plain engine's greedy
tokens (block 16, no prefix caching). Before the fix, a prompt whose window starts in the
second half of a consumer block (``partial``) left that block hashed with bytes the producer
never sent, and the later request resuming two blocks on read them: wrong tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hybridkv import LLM, SamplingParams
from hybridkv.connectors.nixl.layout import GroupDesc
from hybridkv.connectors.nixl.plan import producer_first_block, transfer_end
from tests.e2e_pd.harness import complete, deploy
from tests.engine.helpers import random_ids

MAX_TOKENS = 6
NEW_IDS = 40
PRODUCER_BLOCK = 16


def partial(length: int, window: int, block: int) -> bool:
    """The consumer's first window block starts before the first token the producer kept."""
    end = transfer_end(length, PRODUCER_BLOCK, has_state=False)
    group = GroupDesc("sliding_window", window, 1, 1)
    kept_from = producer_first_block(group, end, PRODUCER_BLOCK) * PRODUCER_BLOCK
    return kept_from > max(0, end - window + 1) // block * block


def reference(model: Path, prompts: list[list[int]]) -> list[str]:
    llm = LLM(
        str(model), dtype="float32", kv_cache_memory="64MiB", block_size=16,
        enable_prefix_caching=False,
    )  # fmt: skip
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    return [o.text for o in outs]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("ratio", "window"), [(4, 128), (8, 200)])
def test_later_prefix_hits_are_exact(
    ratio: int, window: int, checkpoint: Callable[..., Path], tmp_path: Path
) -> None:
    block = PRODUCER_BLOCK * ratio
    model = checkpoint("gemma3", name=f"gemma3-w{window}", sliding_window=window)
    lengths = [300, 437, 521, 700] if ratio == 4 else [300, 342, 551, 700]
    assert any(partial(n, window, block) for n in lengths)  # the case that went wrong
    assert not all(partial(n, window, block) for n in lengths)  # and one that gets hits
    prompts = [random_ids(n, n) for n in lengths]
    later = [
        p[:k] + random_ids(NEW_IDS, 7 * k + len(p))
        for p in prompts
        for k in range(block, len(p) + 1, block)
    ]
    expected = reference(model, prompts + later)
    flags = ("--block-size", str(PRODUCER_BLOCK)), ("--block-size", str(block))
    d = deploy(model, tmp_path, 1, 1, p_flags=flags[0], d_flags=flags[1])
    with d.stack:
        for prompt, want in zip(prompts, expected[: len(prompts)], strict=True):
            body = complete(d.proxy.url, prompt, MAX_TOKENS)
            assert body["choices"][0]["text"] == want, len(prompt)
        wrong, hits = [], 0
        for prompt, want in zip(later, expected[len(prompts) :], strict=True):
            body = complete(d.decode[0].url, prompt, MAX_TOKENS)
            hits += body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            if body["choices"][0]["text"] != want:
                wrong.append(len(prompt) - NEW_IDS)
    assert not wrong, f"wrong tokens after a shared prefix of {wrong} tokens"
    assert hits > 0  # some later requests did resume from the transferred window

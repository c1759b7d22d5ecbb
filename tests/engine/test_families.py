"""The families added for issue 14 through the whole engine: greedy tokens equal
transformers' ``generate`` and logits within 1e-4 (float32), as one batch with chunked prefill,
prefix caching and a short state checkpoint interval, and with requests arriving while others
run, prefix caching on and off; prefix hits at message and interval boundaries.

Prompts (``make_prompt_set``) run past the tiny models' windows, scan chunks and several
checkpoint intervals.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.helpers import (
    assert_matches_hf,
    assert_no_leaks,
    greedy,
    make_engine,
    make_llm,
    make_prompt_set,
    random_ids,
    run_staggered,
)
from tests.engine.test_prefix_caching import Conversation
from tests.support.families import CORE_FAMILIES, FAMILIES, FamilyCheckpoints

PROMPTS = make_prompt_set()
CHUNKED = {"block_size": 8, "max_num_batched_tokens": 20, "state_checkpoint_interval": 16}


@pytest.fixture(scope="session")
def families(family_checkpoints: FamilyCheckpoints) -> FamilyCheckpoints:
    return family_checkpoints


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", FAMILIES)
def test_one_chunked_batch_matches_transformers(family: str, families: FamilyCheckpoints) -> None:
    llm = make_llm(families[family], **CHUNKED)
    outs = llm.generate(PROMPTS, greedy(), use_tqdm=False)
    assert_matches_hf(families[family], PROMPTS, outs, f"{family}/chunked-batch")
    assert_no_leaks(llm.engine)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("family", CORE_FAMILIES)
def test_staggered_requests_match_transformers(
    family: str, caching: bool, families: FamilyCheckpoints
) -> None:
    options: dict[str, Any] = {"enable_prefix_caching": caching}
    engine = make_engine(families[family], **options)
    outs = run_staggered(engine, PROMPTS, greedy(), steps_between=3)
    assert_matches_hf(families[family], PROMPTS, outs, f"{family}/staggered/{caching}")
    num_hit = sum(out.num_cached_tokens for out in outs)
    assert (num_hit > 0) == caching
    assert_no_leaks(engine)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", CORE_FAMILIES)
def test_state_prefix_hits_at_message_and_interval_boundaries(
    family: str, families: FamilyCheckpoints
) -> None:
    conv = Conversation(families[family], block_size=16, state_checkpoint_interval=32)
    base = random_ids(100, 12)
    first = conv.send(base, greedy(6, ignore_eos=True))  # checkpoints at 32, 64, 96
    conv.send(base[:64] + random_ids(30, 14), greedy(4))  # interval boundary 64
    history = base + first.token_ids
    conv.send(history + random_ids(10, 11), greedy(4))  # the last boundary the first passed
    assert conv.hits() == [0, 64, (len(history) - 1) // 16 * 16]
    conv.close()


def test_multimodal_checkpoint_rejects_image_inputs(families: FamilyCheckpoints) -> None:
    llm = make_llm(families["gemma3_mm"])
    image_token = 1000  # image_token_index of the test checkpoint
    with pytest.raises(ValueError, match="placeholder ids \\[1000\\].*text model"):
        llm.engine.add_request([5, image_token, 6], greedy())
    prompt = {"prompt": "hi", "multi_modal_data": {"image": object()}}
    (out,) = llm.generate(prompt, greedy(), use_tqdm=False)
    assert out.finish_reason == "error" and "multi_modal_data" in str(out.error)
    assert_no_leaks(llm.engine)

"""Issue 13 on every state architecture (``LLM``; the HTTP path is tests/server): the first
request sharing a prefix hits a checkpoint the caller named (``cache_boundaries``) or a chat
message's end, taken from inside a single prefill step; outputs and logits equal a run with
prefix caching off."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridkv.chat_boundaries import message_boundaries
from tests.engine.helpers import assert_no_leaks, greedy, make_llm, random_ids
from tests.engine.test_prefix_caching import Conversation
from tests.support.families import STATE_FAMILIES, FamilyCheckpoints

ONE_STEP = {"block_size": 16, "max_num_batched_tokens": 512}  # the prompt in one step


@pytest.fixture(scope="session")
def families(family_checkpoints: FamilyCheckpoints) -> FamilyCheckpoints:
    return family_checkpoints


def _model(family: str, families: FamilyCheckpoints, checkpoints: dict[str, Path]) -> Path:
    return checkpoints[family] if family == "granitemoehybrid" else families[family]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", ["granitemoehybrid", *STATE_FAMILIES])
def test_first_sharer_hits_a_caller_boundary(
    family: str, families: FamilyCheckpoints, checkpoints: dict[str, Path]
) -> None:
    conv = Conversation(_model(family, families, checkpoints), **ONE_STEP)
    first = random_ids(400, 21)
    conv.send(first, greedy(3, extra_args={"cache_boundaries": [64, 200]}))
    conv.send(first[:64] + random_ids(60, 22), greedy(3))
    conv.send(first[:230] + random_ids(20, 23), greedy(3))  # 200 -> 192
    assert conv.hits() == [0, 64, 192]
    conv.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", ["granitemoehybrid", *STATE_FAMILIES])
def test_chat_hits_the_system_prompt_the_first_time(
    family: str, families: FamilyCheckpoints, checkpoints: dict[str, Path]
) -> None:
    model = _model(family, families, checkpoints)
    cached, plain = make_llm(model, **ONE_STEP), make_llm(model, enable_prefix_caching=False)
    system = {"role": "system", "content": " ".join(["cache state blocks and layers"] * 20)}
    chats = [[system, {"role": "user", "content": q}] for q in ("what is a block", "why a state")]
    tok = cached.tokenizer
    outs = [cached.chat(c, greedy(3), use_tqdm=False)[0] for c in chats]
    refs = [plain.chat(c, greedy(3), use_tqdm=False)[0] for c in chats]
    assert [o.token_ids for o in outs] == [r.token_ids for r in refs]
    ids = tok.encode(tok.apply_chat_template(chats[1], add_generation_prompt=True))
    system_end = message_boundaries(tok, chats[1], ids)[0]
    assert system_end >= 96
    assert [o.num_cached_tokens for o in outs] == [0, system_end // 16 * 16]
    assert_no_leaks(cached.engine)

"""``LLM.reset_prefix_cache``: refused (nothing changes) while a request is unfinished, a
clean empty cache when idle (no leaks, the next run recomputes and answers the same), and a
clear error when tiers are asked of an engine without them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridkv import LLM, SamplingParams
from hybridkv.connectors.tier_events import NoTiersError
from tests.support.checkpoints import SharedCheckpoints
from tests.support.lifetimes import track

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
PROMPT = [(7 * i) % 500 + 3 for i in range(70)]


@pytest.fixture(scope="module")
def model(shared_checkpoints: SharedCheckpoints) -> Path:
    return shared_checkpoints.get("granitemoehybrid")


def make(model: Path, **kw: object) -> LLM:
    return track(LLM(model=str(model), dtype="float32", kv_cache_memory="4MiB", block_size=16,
                     max_model_len=256, max_num_seqs=4, num_state_slots=16, **kw))  # fmt: skip


def test_refused_while_running_then_an_empty_cache(model: Path) -> None:
    llm = make(model)
    engine = llm.engine
    first = llm.generate([PROMPT], PARAMS, use_tqdm=False)[0]
    cached = dict(engine.kv.pool.cached)
    assert cached
    engine.add_request(PROMPT + [11, 12], PARAMS, request_id="busy")
    engine.step()
    result = engine.reset_prefix_cache()
    assert not result.ok and "1 requests are running or waiting" in result.reason
    assert not llm.reset_prefix_cache()
    assert cached.keys() <= engine.kv.pool.cached.keys()  # nothing was dropped
    while engine.has_unfinished_requests():
        engine.step()
    assert llm.reset_prefix_cache()
    assert not engine.kv.pool.cached and all(not sm.pool.cached for sm in engine.kv.state)
    engine.kv.check_integrity()
    assert engine.kv.is_idle()
    again = llm.generate([PROMPT], PARAMS, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0 and again.token_ids == first.token_ids
    engine.kv.check_integrity()


def test_tiers_without_tiers_is_an_error_and_changes_nothing(model: Path, tmp_path: Path) -> None:
    llm = make(model)
    llm.generate([PROMPT], PARAMS, use_tqdm=False)
    with pytest.raises(NoTiersError, match="no KV connector is configured"):
        llm.reset_prefix_cache(tiers=True)
    assert llm.engine.kv.pool.cached
    kv = {"kv_connector": "FileConnector", "kv_connector_extra_config": {"path": str(tmp_path)}}
    with_file = make(model, kv_transfer_config=kv)
    with pytest.raises(NoTiersError, match="keeps no storage tiers"):
        with_file.reset_prefix_cache(tiers=True)
    assert with_file.reset_prefix_cache()
    with_file.engine.shutdown()

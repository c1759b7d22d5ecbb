"""The issue-14 families behind the offloading connector (CPU + disk tiers) wrapped in
``FaultInjection``: loads fail, corrupt and time out, yet every output equals the run that
caches nothing, and nothing leaks. One lean run per model code path."""

from __future__ import annotations

import pytest

from tests.support.families import CORE_FAMILIES, FamilyCheckpoints

from .helpers import (
    assert_clean,
    counters,
    generate,
    make_llm,
    offload,
    reference,
    reset_device_cache,
)
from .test_load_and_faults import faulty, shared_prompts


@pytest.fixture(scope="session")
def families(family_checkpoints: FamilyCheckpoints) -> FamilyCheckpoints:
    return family_checkpoints


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", CORE_FAMILIES)
def test_offloading_under_faults_stays_exact(
    family: str, families: FamilyCheckpoints, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model = families[family]
    prompts = shared_prompts()[:8]
    want = reference(model, prompts)
    disk = tmp_path_factory.mktemp(f"disk_{family}")
    config = faulty(
        offload(cpu="8MiB", disk=disk),
        block_failure_rate=0.2,
        corrupt_rate=0.2,
        request_failure_rate=0.2,
        seed=3,
    )
    llm = make_llm(model, config)
    outs = generate(llm, prompts[:4])
    reset_device_cache(llm)
    outs += generate(llm, prompts[4:])
    assert [o.token_ids for o in outs] == want
    c = counters(llm)
    assert c["hits.cpu"] > 0, c
    assert any(name.startswith("injected_failures") for name in c), c
    assert_clean(llm)

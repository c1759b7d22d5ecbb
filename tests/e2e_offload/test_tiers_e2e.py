"""Real tiny models: a shared prefix comes back from the CPU tier, then from disk once the CPU
tier evicted it; greedy outputs equal a run that caches nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import ARCHS
from .helpers import (
    OTHER,
    PROMPTS,
    assert_clean,
    counters,
    generate,
    make_llm,
    offload,
    reference,
    reset_device_cache,
    unit_bytes,
)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_from_cpu_then_from_disk(
    arch: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    model = checkpoints[arch]
    prompts = [PROMPTS[0], PROMPTS[1], OTHER, PROMPTS[2], PROMPTS[0]]
    want = reference(model, prompts)
    # LRU: OTHER's units evict the reused prefix (by value they would be skipped instead)
    llm = make_llm(model, offload(cpu=5 * unit_bytes(model), disk=tmp_path, eviction="lru"))
    first = generate(llm, prompts[:1])
    assert first[0].cached_tokens == {"local": 0}
    reset_device_cache(llm)  # the device prefix cache forgets: only the tiers remember

    from_cpu = generate(llm, prompts[1:2])
    assert from_cpu[0].cached_tokens == {"local": 0, "cpu": 128}
    other = generate(llm, prompts[2:3])  # 5 units: evicts the prefix from the CPU tier
    reset_device_cache(llm)
    from_disk = generate(llm, prompts[3:4])
    assert from_disk[0].cached_tokens == {"local": 0, "disk": 128}
    reset_device_cache(llm)
    again = generate(llm, prompts[4:5])  # the disk hit was promoted into the CPU tier
    assert again[0].cached_tokens == {"local": 0, "cpu": 128}

    outs = first + from_cpu + other + from_disk + again
    assert [o.token_ids for o in outs] == want
    c = counters(llm)
    assert c["hits.cpu"] == 8 and c["hit_tokens.cpu"] == 256 and c["promotions.cpu"] == 4
    assert c["hits.disk"] == 4 and c["hit_tokens.disk"] == 128
    assert c["evictions.cpu"] >= 4 and c["offload_bytes.disk.load"] > 0
    assert c["offload_bytes.cpu.store"] == c["offload_bytes.disk.store"]  # write-through
    assert not any(name.startswith("load_failures") for name in c)
    assert_clean(llm)
    llm.engine.shutdown()


def test_local_hit_plus_cpu_tail(checkpoints: dict[str, Path]) -> None:
    """The device cache keeps the head, the CPU tier supplies the rest after it."""
    model = checkpoints["granitemoehybrid"]
    longer = PROMPTS[0][:148] + [7] * 40
    want = reference(model, [PROMPTS[0], longer])
    llm = make_llm(model, offload(cpu="8MiB"))
    outs = generate(llm, [PROMPTS[0]])
    outs += generate(llm, [longer])
    assert [o.token_ids for o in outs] == want
    assert outs[1].cached_tokens["local"] + outs[1].cached_tokens.get("cpu", 0) >= 128
    assert_clean(llm)

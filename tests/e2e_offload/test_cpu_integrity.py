"""Real tiny models: a flipped byte in any checksummed segment of a CPU-tier part (first,
middle, last; attention or state) is caught at load, counted, recovered by recompute, and the
greedy outputs equal a run that caches nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybridkv.connectors.offloading.tiers.cpu import tier as cpu_tier
from hybridkv.kv.hashing import BlockHasher, get_hash_fn

from .helpers import (
    PREFIX,
    PROMPTS,
    assert_clean,
    counters,
    generate,
    make_llm,
    offload,
    reference,
    reset_device_cache,
    sched,
)

C = 64  # four blocks per full-attention part: with one row per segment, four segments


@pytest.mark.parametrize("arch", ["qwen3", "granitemoehybrid"])
def test_a_flipped_byte_in_any_cpu_segment_is_recomputed(
    arch: str, checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = checkpoints[arch]
    want = reference(model, PROMPTS[:5])
    llm = make_llm(model, offload(cpu="64MiB", chunk_tokens=C))
    layout = llm.engine.layout
    monkeypatch.setattr(cpu_tier, "SEGMENT_BYTES", layout.group_size * layout.layer_page_bytes)
    outs = generate(llm, PROMPTS[:1])  # stores the units ending at 64 and 128
    hashes: list[Any] = []
    BlockHasher(16, get_hash_fn("sha256")).extend(hashes, PREFIX)
    full, last = layout.attention_group_ids[0], layout.groups[-1].group_id  # sliding or state
    victims = [(3, full, "first"), (7, full, "middle"), (3, full, "last"), (7, last, "middle")]
    cpu = sched(llm).cpu
    assert cpu is not None
    for i, (hash_index, group, where) in enumerate(victims):
        part = cpu.index.entries[hashes[hash_index]].parts[group]  # stored (again) by now
        num_segments = len(part.checksums)
        assert num_segments >= 2
        segment = {"first": 0, "middle": num_segments // 2, "last": num_segments - 1}[where]
        rows = part.rows_per_segment
        segment_bytes = part.array[segment * rows : (segment + 1) * rows].nbytes
        offset = segment * rows * part.array[:1].nbytes + segment_bytes // 2
        if where == "last":
            offset = part.data.numel() - 1
        part.data.view(-1)[offset] ^= 0x40
        reset_device_cache(llm)
        outs += generate(llm, PROMPTS[i + 1 : i + 2])
        c = counters(llm)
        assert c["load_failures:corrupt"] == i + 1 and c["removed.cpu"] == i + 1
        assert hashes[hash_index] in cpu.index.entries  # recomputed and stored again
    assert [o.token_ids for o in outs] == want
    transfer = llm.engine.scheduler.transfer
    assert transfer is not None and transfer.stats.failed_requests == len(victims)
    assert_clean(llm)
    llm.engine.shutdown()

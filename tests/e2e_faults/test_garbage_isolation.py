"""Bytes a failed load leaves behind must not reach any other request.

A failed load's blocks and state slots hold arbitrary bytes (``FaultInjection`` writes random
ones, as a transfer that breaks half-way would). Recovery discards the affected request's step
output and frees or rewinds its blocks, which other requests then reuse. Random bytes read as
float32 include NaN and +-inf, so the engine must keep them out of every other request:

- attention reads whole blocks; the slots past a request's last token are masked, but must
  contribute exactly nothing, whatever bytes they hold (``0 * NaN`` is NaN);
- a Mamba2 prefill pads rows to one length; a padded position must not carry another request's
  values (a NaN row must not poison the rows batched with it).

Both are found by the fault matrix (``test_fault_matrix.py``); these are their minimal forms.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .conftest import Builder
from .workload import (
    assert_no_leaks,
    fault_config,
    file_config,
    generate,
    make_llm,
    random_ids,
)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
@pytest.mark.parametrize("fill", [float("nan"), float("inf")])
def test_stale_bytes_in_a_reused_block_do_not_change_the_output(
    checkpoint: Builder, arch: str, fill: float
) -> None:
    model = checkpoint(arch)
    prompt = random_ids(40, 31)  # 2.5 blocks: the last block is partly written
    reference = generate(make_llm(model), [prompt])[0].token_ids
    llm = make_llm(model)
    generate(llm, [random_ids(70, 32)])  # something ran; its blocks are free again
    assert llm.engine.kv.reset_prefix_cache()
    # what a failed load leaves in blocks it was writing (the null block 0 is never written)
    for backing in llm.engine.runner.cache.backing:
        backing[1:].view(torch.float32).fill_(fill)
    out = generate(llm, [prompt])[0]
    assert out.token_ids == reference, f"stale {fill} bytes in masked key slots changed the output"
    assert_no_leaks(llm)


def test_a_request_on_bad_kv_does_not_poison_the_prefill_rows_batched_with_it(
    checkpoint: Builder, tmp_path: Path
) -> None:
    """Granite 4.0-H, sync load: request A loads 32 tokens whose state is broken (every load
    fails), so A computes its 8 remaining tokens on garbage in the same step as B, a fresh
    5-token prompt with no external hit. B is never affected by any fault."""
    model = checkpoint("granitemoehybrid")
    a, b = random_ids(40, 41), random_ids(5, 42)
    reference = [o.token_ids for o in generate(make_llm(model), [a, b])]
    writer = make_llm(model, file_config(tmp_path))
    generate(writer, [a])
    writer.engine.shutdown()

    llm = make_llm(model, fault_config(tmp_path, "sync", request_failure_rate=1.0))
    out_a, out_b = generate(llm, [a, b])
    stats = llm.engine.scheduler.transfer.stats
    assert stats.failed_requests == 1 and stats.load_failures == {"injected": 1}
    assert out_b.cached_tokens == {"local": 0}, "B had no external hit"
    assert out_b.token_ids == reference[1], "B was computed in a batch with A's garbage"
    assert out_a.token_ids == reference[0]
    llm.engine.shutdown()
    assert_no_leaks(llm)

"""A producer keeps only what its consumer reads once a ``do_remote_decode`` prompt ends:
the blocks before E (sliding-window groups: the window ending at E plus one block) and the
staged state; the live state slot and every other block are released at once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hybridkv.connectors.nixl.layout import group_descs
from hybridkv.connectors.nixl.plan import producer_first_block
from hybridkv.engine.core import EngineCore
from tests.connectors.nixl.pair import consumer, drain_clean, greedy, producer, run
from tests.engine.helpers import make_engine, random_ids

Checkpoint = Callable[..., Path]


def held_blocks(engine: EngineCore) -> int:
    pool = engine.kv.pool
    return pool.capacity - pool.num_free


def held_slots(engine: EngineCore) -> int:
    return sum(sm.pool.capacity - sm.pool.num_free for sm in engine.kv.state)


def record_notifications(engine: EngineCore) -> list[bytes]:
    """The notification each READ the engine's NIXL agent posts carries (a prepared READ, the
    lease word's, carries none)."""
    assert engine.connector is not None
    agent = engine.connector.worker.agent  # type: ignore[attr-defined]
    post, post_prepared, seen = agent.read, agent.read_prepared, []

    def read(remote: str, descs: Any, notif: bytes) -> Any:
        seen.append(notif)
        return post(remote, descs, notif)

    def read_prepared(*args: Any) -> Any:
        seen.append(b"")
        return post_prepared(*args)

    agent.read, agent.read_prepared = read, read_prepared
    return seen


def expected_blocks(engine: EngineCore, end: int) -> int:
    """Per attention group: table entries [first, cdiv(E, B)) of the producer's plan."""
    b = engine.kv.block_size
    groups = [g for g in group_descs(engine.layout) if g.token_bytes]
    return sum(-(-end // b) - producer_first_block(g, end, b) for g in groups)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("arch", "n"), [("granitemoehybrid", 150), ("gemma3", 300)])
def test_finished_prompt_pins_only_what_the_consumer_reads(
    checkpoint: Checkpoint, arch: str, n: int
) -> None:
    model = checkpoint(arch)
    p, d, plain = producer(model), consumer(model), make_engine(model)
    try:
        prompt = random_ids(n, 11)
        pre = run(p, prompt, greedy(1, {"do_remote_decode": True}))
        params = pre.kv_transfer_params
        assert params is not None and params["num_tokens"] > 0
        end = params["num_tokens"]
        rid = pre.request_id
        # the prompt has ended; the consumer has not read yet
        assert held_slots(p) == 0  # the live state slot is back (E's state is staged)
        assert held_blocks(p) == expected_blocks(p, end)
        b = p.kv.block_size
        for m in p.kv.attn:
            assert len(m.tables[rid]) == -(-end // b)  # nothing past E
        p.kv.check_integrity()
        p.step()  # its lease starts (a real producer steps at once; the word then reads it)
        notes = record_notifications(d)
        out = run(d, prompt, greedy(params=params), p)
        assert notes == [b"", b""]  # data, then lease word: a READ with one waits for it (ms)
        assert out.token_ids == run(plain, prompt, greedy()).token_ids
        drain_clean(p, d)
    finally:
        p.shutdown()
        d.shutdown()

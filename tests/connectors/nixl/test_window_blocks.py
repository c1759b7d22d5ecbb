"""No block is ever hashed with bytes it does not hold, whatever the two sides' block sizes.

Device-free: real schedulers, coordinators and NixlConnector scheduler halves on both sides,
bytes moved by ``plan.load_rows`` (``window_sim``). With a consumer block more than twice the
producer's, the window's first consumer block starts before the first token the producer kept;
it used to be hashed after the load, and a later request whose window reached into it read KV
that never arrived.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv.connectors.nixl.layout import GroupDesc
from hybridkv.connectors.nixl.plan import (
    consumer_range,
    first_held,
    first_whole_entry,
    transfer_end,
)
from tests.connectors.nixl.signing import signed
from tests.connectors.nixl.window_sim import SimEngine, make_engine
from tests.sched.page_runner import reference_generation

MAX_TOKENS = 3
SLIDING = GroupDesc("sliding_window", 128, 1, 8)
FULL = GroupDesc("full_attention", 0, 1, 8)


def transfer(prompt: list[int], window: int, bp: int, bc: int, warm: int) -> SimEngine:
    """Prefill ``prompt`` on a producer (blocks of ``bp``), decode it on a consumer (blocks of
    ``bc``, a local hit of ``prompt[:warm]`` first); the consumer, ready for later requests."""
    producer = make_engine(bp, window, "kv_producer")
    req = producer.add("p", prompt, 1, {"do_remote_decode": True})
    producer.run()
    assert isinstance(req.kv_transfer_params, dict)
    consumer = make_engine(bc, window, "kv_consumer", producer=producer)
    if warm:
        consumer.add("warm", prompt[:warm], 1)
        consumer.run()
    decode = consumer.add("d", prompt, MAX_TOKENS, req.kv_transfer_params)
    consumer.run()
    assert consumer.outputs["d"] == reference_generation(prompt, MAX_TOKENS)
    end = transfer_end(len(prompt), bp, has_state=False)
    if consumer.worker.loads:  # not all of it was a local hit
        assert decode.cached_tokens.get("nixl") == end - consumer.worker.loads[0].start
    return consumer


def later(consumer: SimEngine, rid: str, prompt: list[int]) -> None:
    consumer.add(rid, prompt, MAX_TOKENS)
    consumer.run()  # asserts the invariant after every step
    assert consumer.outputs[rid] == reference_generation(prompt, MAX_TOKENS), rid
    assert not consumer.runner.disagreements


block_sizes = st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16])
ratios = st.sampled_from([1, 2, 3, 4, 8, 0.5, 0.25, 0.125])


PROGRAMS = {
    "window": st.integers(2, 80),
    "bp": block_sizes,
    "ratio": ratios,
    "length": st.integers(2, 220),
    "warm": st.floats(0, 1),
    "prefix": st.floats(0, 1),
    "num_new": st.integers(1, 40),
    "seed": st.integers(0, 1 << 16),
}
QUICK = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def no_block_is_hashed_without_its_bytes(
    window: int,
    bp: int,
    ratio: float,
    length: int,
    warm: float,
    prefix: float,
    num_new: int,
    seed: int,
) -> None:
    bc = max(1, int(bp * ratio))
    rng = random.Random(seed)
    prompt = [rng.randrange(997) for _ in range(length)]
    consumer = transfer(prompt, window, bp, bc, int(warm * (length - 1)))
    shared = int(prefix * length)
    later(consumer, "block_multiple", prompt[: shared // bc * bc] + [7] * num_new)
    later(consumer, "any", prompt[:shared] + [rng.randrange(997) for _ in range(num_new)])
    later(consumer, "whole", prompt + [5] * num_new)
    consumer.kv.check_integrity()
    assert consumer.kv.is_idle()


# the fast tier's run, and the full budget (120 programs) in ``make test``
test_no_block_is_hashed_without_its_bytes = QUICK(
    given(**PROGRAMS)(no_block_is_hashed_without_its_bytes)
)
test_no_block_is_hashed_without_its_bytes_deep = pytest.mark.slow(
    settings(QUICK, max_examples=120)(given(**PROGRAMS)(no_block_is_hashed_without_its_bytes))
)


@pytest.mark.parametrize("ratio", [4, 8])
def test_the_issue_trace_at_ratios_4_and_8(ratio: int) -> None:
    """Window 128, producer blocks of 16, consumer blocks of 16 * ratio: prompts of 300-700
    ids, then requests sharing a block-multiple prefix plus 40 new ids (wrong tokens before
    the fix: a partial window block was hashed)."""
    rng = random.Random(ratio)
    bc = 16 * ratio
    for length in (300, 437, 521, 700):
        prompt = [rng.randrange(997) for _ in range(length)]
        consumer = transfer(prompt, 128, 16, bc, 0)
        for k in range(1, length // bc + 1):
            later(consumer, f"l{length}-{k}", prompt[: k * bc] + [9] * 40)


def test_the_partial_window_block_is_the_one_skipped() -> None:
    """E = 400, window 128: the window starts at 273; the producer (blocks of 16) keeps from
    256; a consumer block of 64 starting at 256 is whole, one of 128 starting at 256 too, one
    of 256 starting at 256 too; with the window at 301 (E = 428) the producer keeps from 272
    and the consumer's 64-block at 256 is partial: its whole entries start at 5."""
    assert first_whole_entry(SLIDING, 0, 400, 64, 256) == 4
    assert first_whole_entry(SLIDING, 0, 428, 64, 272) == 5
    assert consumer_range(SLIDING, 0, 428, 64, 272) == (272, 428)
    assert first_whole_entry(FULL, 128, 428, 64, 0) == 2  # after the local hit: all whole
    assert first_whole_entry(SLIDING, 0, 428, 64, None) == 5  # unknown: only what is needed


@pytest.mark.parametrize(
    ("field", "forge", "message"),
    [
        ("remote_block_size", lambda v: 8, "handshake says 16"),
        ("remote_block_starts", lambda v: [v[0] + 3, v[1]], "needs them from"),
        ("remote_block_starts", lambda v: [10**9, v[1]], "needs them from"),
        ("remote_block_ids", lambda v: [v[0][:2], v[1]], "remote_block_ids of attention"),
        ("num_tokens", lambda v: v - 60, "needs them from"),
    ],
)
def test_params_the_producer_contradicts_fail_the_load_alone(
    field: str, forge: Any, message: str
) -> None:
    """Params that contradict the producer's layout although signed (the block size, where the
    producer's tables start, how long they are, the transfer end; a negative block size never
    gets here: the boundary parse refuses it): the load fails with a reason naming the field and the request is
    recomputed to the exact tokens; nothing is hashed without its bytes meanwhile."""
    rng = random.Random(3)
    prompt = [rng.randrange(997) for _ in range(300)]
    producer = make_engine(16, 128, "kv_producer")
    req = producer.add("p", prompt, 1, {"do_remote_decode": True})
    producer.run()
    params = dict(req.kv_transfer_params or {})
    params[field] = forge(params[field])
    params = signed(params, prompt=prompt)  # a producer's own contradiction: the signature holds
    consumer = make_engine(64, 128, "kv_consumer", producer=producer)
    consumer.add("d", prompt, MAX_TOKENS, params)
    consumer.run()  # asserts the invariant after every step
    assert consumer.outputs["d"] == reference_generation(prompt, MAX_TOKENS)
    assert len(consumer.worker.failures) == 1
    assert message in consumer.worker.failures[0]
    later(consumer, "after", prompt[:192] + [9] * 40)


@pytest.mark.parametrize("first", [-16, 302, 1000])
def test_params_claiming_less_than_the_window_needs_are_refused(first: int) -> None:
    with pytest.raises(ValueError, match="needs them from 301|remote_block_starts"):
        consumer_range(SLIDING, 0, 428, 64, first)


def test_a_prefill_chunk_ending_at_the_transfer_end_still_transfers() -> None:
    """Chunks of 64 end at E = 320: the producer's step there freed the window's entries
    before 193 // 16 = 12, the extra block 11 included, so its params start at entry 12
    (``first_held``); a consumer with blocks of 40 reads from 192 and hashes entry 4
    ([160, 200)) never. Before, the params listed a null block and the load failed."""
    assert first_held([0, 0, 7, 8], 1) == 2 and first_held([0, 0], 0) == 2
    rng = random.Random(5)
    prompt = [rng.randrange(997) for _ in range(321)]
    consumer = transfer(prompt, 128, 16, 40, 0)  # asserts all 320 tokens came from nixl
    assert not consumer.worker.failures
    later(consumer, "later", prompt[:240] + [9] * 40)


def test_the_partial_block_by_id() -> None:
    """The issue's trace, prompt of 300: E = 299, the window starts at 172, the producer
    (blocks of 16) kept from 144; the consumer's sliding-window load fills entries 2..4
    (blocks of 64): entry 2 ([128, 192)) only from 144, so its block is never hashed; entry 3
    is; entry 4 ([256, 320)) is not full yet (300 prompt + 3 output tokens)."""
    rng = random.Random(4)
    prompt = [rng.randrange(997) for _ in range(300)]
    consumer = transfer(prompt, 128, 16, 64, 0)
    spec = consumer.worker.loads[0]
    layout = consumer.kv.layout
    kinds = [layout.groups[g].kind.value for g in layout.attention_group_ids]
    j = kinds.index("sliding_window")
    assert spec.block_indices[j] == [2, 3, 4]
    hashed = [consumer.kv.pool.key[b] is not None for b in spec.block_ids[j]]
    assert hashed == [False, True, False]
    assert spec.block_indices[1 - j] == [0, 1, 2, 3, 4]
    hashed = [consumer.kv.pool.key[b] is not None for b in spec.block_ids[1 - j]]
    assert hashed == [True, True, True, True, False]

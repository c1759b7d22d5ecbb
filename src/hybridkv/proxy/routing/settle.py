"""Settle: before a decision, let an engine's index catch up with what the engine published.

Every answer of an engine with KV events carries ``usage.kv_events_seq``: the last batch the
engine published before the answer, so the batches up to it hold the answer's own blocks
(``docs/kv_events.md``). The proxy keeps, per engine, the largest such seq it was told
(``note_answer``); when the engine's subscriber has applied fewer batches, its index lags
what the engine holds -- a conversation's next turn, sent the moment the last one was
answered, would be predicted a miss on the engine that has its history. ``settle`` waits
for those indexes, at most::

    min(--settle-max-seconds, MAX_SETTLE_SECONDS, what the wait could save:
        the prompt's tokens x the engine's measured prefill seconds per token)

An answer's seq is the engine's word: one far beyond the batches the proxy received
(``FORGED_MARGIN``) cannot be a lag (an engine publishes a few batches per step), so it is
rejected and counted, never waited on; after an engine restart (its sequence went back) or
once it is found down, seqs of its earlier life are forgotten.

``await_prefill``: a request whose prefix the chosen engine is prefilling right now for
another request waits for that prefill to land (a first streamed chunk carries its
``kv_events_seq`` too) and is predicted on the index then. The engine would hold it behind
that prefill anyway (its in-flight prefix rule, ``sched/inflight.py``: a waiting request
whose next blocks a running prefill computes waits for them), so the wait is not capped by
what recomputing would cost: it lasts while the source holds its reservation (until its
first answer bytes, or its end) and its events are on the way, at most the proxy's
first-byte timeout (the source's own first byte is bounded by it) -- a prediction made on
the landed prefix is exact by construction, one made while it computes is a guess about
timing. On an attention-only engine the landed hit is known beforehand (every block the
source computes is hit: ``EngineState.landed_hit_tokens``), so with ``--prefill-wait auto``
the request is sent at once and queues in the engine instead (``service.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

from hybridkv.kv.hashing import BlockHash
from hybridkv.proxy.routing.engines import EngineState

MAX_SETTLE_SECONDS = 2.0
FORGED_MARGIN = 1024  # batches an answer may be ahead of the stream the proxy received
POLL_SECONDS = 0.002


@dataclass(slots=True)
class SettleStats:
    num_waits: int = 0  # decisions that waited for an index
    num_caught_up: int = 0  # ... and saw it catch up in time
    wait_seconds: float = 0.0
    num_forged: int = 0  # answers whose seq no engine could have published
    num_prefill_waits: int = 0  # decisions that waited for a prefill of their prefix
    prefill_wait_seconds: float = 0.0
    num_prefill_wait_timeouts: int = 0  # ... that ran out (the first-byte timeout)
    num_prefill_dispatched: int = 0  # ... sent at once with the landed hit predicted


def received_seq(engine: EngineState) -> int:
    """The last batch the engine's subscriber applied (-1: none)."""
    sub = engine.subscriber
    last = sub.stats.last_seq if sub is not None else None
    return -1 if last is None else last


def note_answer(engine: EngineState, seq: int, stats: SettleStats) -> bool:
    """An answer of ``engine`` said ``usage.kv_events_seq == seq``: remember it (False: it is
    impossible, rejected and counted)."""
    sub = engine.subscriber
    if sub is None or seq < 0 or seq > received_seq(engine) + FORGED_MARGIN:
        stats.num_forged += 1
        return False
    restarts = sub.stats.num_restarts
    if restarts != engine.answered_restarts:
        engine.answered_restarts, engine.answered_seq = restarts, -1
    engine.answered_seq = max(engine.answered_seq, seq)
    return True


def forget_answers(engine: EngineState) -> None:
    """The engine went down (it may come back restarted, its sequence from 0)."""
    engine.answered_seq = -1


def lagging(engine: EngineState) -> bool:
    sub = engine.subscriber
    if sub is None or not engine.indexed or sub.stats.num_restarts != engine.answered_restarts:
        return False
    return received_seq(engine) < engine.answered_seq


def settle_budget(engines: Iterable[EngineState], num_tokens: int, max_seconds: float) -> float:
    """How long a decision may wait for these lagging engines' events."""
    saved = max((e.token_seconds * num_tokens for e in engines), default=0.0)
    return max(0.0, min(max_seconds, MAX_SETTLE_SECONDS, saved))


async def settle(
    engines: Iterable[EngineState], num_tokens: int, max_seconds: float, stats: SettleStats
) -> bool:
    """Wait until no engine's index lags its answers, within the budget; True if none lags
    at the end (or none did)."""
    behind = [e for e in engines if lagging(e)]
    if not behind:
        return True
    budget = settle_budget(behind, num_tokens, max_seconds)
    stats.num_waits += 1
    start = time.monotonic()
    while behind and time.monotonic() - start < budget:
        await asyncio.sleep(POLL_SECONDS)
        behind = [e for e in behind if lagging(e)]
    stats.wait_seconds += time.monotonic() - start
    stats.num_caught_up += not behind
    return not behind


async def await_prefill(
    engine: EngineState,
    hashes: list[BlockHash],
    num_tokens: int,
    stats: SettleStats,
    max_seconds: float,
) -> bool:
    """The chosen engine is computing this prompt's prefix for a request the proxy sent
    there: wait until that prefill is done (its first answer bytes) and its events are in
    the index, so the prediction counts the prefix it will reuse once landed -- within
    ``max_seconds`` (the proxy's first-byte timeout: the source's own first byte is bounded
    by it). False: the wait ran out (counted)."""
    if engine.pending_hit_tokens(hashes, num_tokens) == 0:
        return True
    stats.num_prefill_waits += 1
    start = time.monotonic()
    landed = True
    while engine.pending_hit_tokens(hashes, num_tokens) > 0 or lagging(engine):
        if time.monotonic() - start >= max_seconds:
            stats.num_prefill_wait_timeouts += 1
            landed = False
            break
        await asyncio.sleep(POLL_SECONDS)
    stats.prefill_wait_seconds += time.monotonic() - start
    return landed

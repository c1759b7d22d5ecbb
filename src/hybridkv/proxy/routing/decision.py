"""One request's routing: which decode engines to try in which order, why, what each was
predicted to hold -- and, once answered, what it did hold.

::

    round_robin  the router's turn (healthy engines first)
    cache        the longest predicted hit; ties by fewer requests in flight, then the turn
    cost         the least expected time to first token, plus what recomputing costs the
                 requests after it:
                   (queued uncached tokens + this prompt's uncached tokens
                    + RECOMPUTE_WEIGHT x busy x tokens another engine holds that this one
                      would recompute)
                   x prefill s/token (the engine's measured cost, within 1.25x of the median)
                 busy: the fraction of engines with requests in flight. An idle fleet is
                 scored by time to first token alone; a saturated one charges a recomputed
                 token 1 + RECOMPUTE_WEIGHT times (this request waits for it, and so do the
                 requests queued behind it, on engines that share the host's cores too), so
                 a conversation stays where its state is unless that engine's queue exceeds
                 the other's by 1 + RECOMPUTE_WEIGHT times its history (overloaded); ties by
                 fewer requests in flight, then the turn

Unhealthy engines come last in every order (tried only when no other answered).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from hybridkv.kv.hashing import BlockHash
from hybridkv.proxy.routing.engines import EngineState
from hybridkv.proxy.routing.settle import SettleStats, note_answer

MAX_USAGE_SCAN_BYTES = 1 << 20  # an answer's tail searched for its usage
# measured on B7 (docs/benchmarks.md): at 1 `cost` recomputed 1.21-1.81x the single-cache
# floor (conversations left their engine too readily); at 3 1.09-1.15x, like `cache`
RECOMPUTE_WEIGHT = 3.0


class Policy(str, Enum):
    ROUND_ROBIN = "round_robin"
    CACHE = "cache"
    COST = "cost"


class Reason(str, Enum):
    ROUND_ROBIN = "round_robin"
    CACHE_HIT = "cache_hit"  # the chosen engine holds part of the prompt
    LOAD = "load"  # no engine holds any of it (or it was not indexed): least loaded
    NO_PROMPT = "no_prompt"  # the prompt could not be read: least loaded
    PREFILL_SKIPPED = "prefill_skipped"  # P/D: the decode engine holds the prompt


@dataclass(slots=True)
class Decision:
    order: list[str]
    reason: Reason
    num_prompt_tokens: int = 0
    predicted: dict[str, int] = field(default_factory=dict)  # url -> predicted hit tokens
    engines: dict[str, EngineState] = field(default_factory=dict)
    # url -> what routing expects: the prediction, or more where requests in flight there
    # compute this prompt's prefix (their blocks are not announced yet)
    expected: dict[str, int] = field(default_factory=dict)
    hashes: dict[str, list[BlockHash]] = field(default_factory=dict)  # url -> prompt blocks
    settle: SettleStats | None = None  # answers' usage.kv_events_seq are noted (settle.py)
    log: deque[dict[str, object]] | None = None  # answered predictions (GET predictions)
    settled: bool = True  # no index lagged its engine's answers when predicted (settle.py)
    number: int = 0  # the decision's number in this proxy (its log's ``id``), never changed
    queued: dict[str, int] = field(default_factory=dict)  # url -> its queued tokens, decided
    # the chosen engine was computing this prompt's prefix for another decision: that
    # decision's number, and what routing did about it: "landed" (waited until it landed),
    # "timeout" (the wait ran out), "dispatched" (sent at once, predicted the landed hit)
    source: int | None = None
    prefill_wait: str = ""
    prefill_wait_seconds: float = 0.0
    _held: str | None = None  # the engine whose ``pending`` holds this prompt's blocks
    _sent_to: str | None = None
    _actual: int | None = None
    _queued: int = 0  # uncached tokens booked on the engine until its first answer bytes

    @property
    def chosen(self) -> str:
        return self.order[0]

    def describe(self) -> dict[str, object]:
        return {
            "order": self.order,
            "reason": self.reason.value,
            "num_prompt_tokens": self.num_prompt_tokens,
            "predicted_cached_tokens": self.predicted,
            "expected_cached_tokens": self.expected,
        }

    def uncached(self, url: str) -> int:
        hit = max(self.predicted.get(url, 0), self.expected.get(url, 0))
        return max(0, self.num_prompt_tokens - hit)

    def reserve(self) -> None:
        """Decided: the chosen engine's ``pending`` holds this prompt's blocks from now on
        (a request decided before this one is dispatched meets it there), until its first
        answer bytes (its prefill is done) or it is sent elsewhere."""
        self._hold(self.chosen)

    def dispatched(self, url: str) -> None:
        """The decode engine ``url`` accepted the request (its first byte came)."""
        self.release()
        engine = self.engines.get(url)
        if engine is not None:
            engine.num_inflight += 1
            self._queued = self.uncached(url)
            engine.queued_tokens += self._queued
            self._hold(url)
        self._sent_to = url

    def _hold(self, url: str) -> None:
        if self._held == url:
            return
        self._unhold()
        engine = self.engines.get(url)
        if engine is not None:
            engine.hold_pending(self.hashes.get(url, []), self.number)
            self._held = url

    def unreserve(self) -> None:
        """The proxy is done routing the request (answered, refused, cancelled): whatever
        happened, its blocks are no longer being computed for it."""
        self._unhold()

    def _unhold(self) -> None:
        engine = self.engines.get(self._held) if self._held is not None else None
        self._held = None
        if engine is not None:
            engine.drop_pending(self.hashes.get(engine.url, []))

    def saw(self, data: bytes) -> None:
        """An answer's bytes (a whole body, or stream events): its prefill is done (the
        first token came), so its work leaves the queue; keep its cached tokens. The seq its
        first chunk names is noted before its reservation goes: a decision waiting for this
        prefill to land then waits for those events too (``settle.await_prefill``)."""
        if b'"kv_events_seq"' in data:  # a first chunk's (also when the usage came with it)
            self._note_seq(_first_chunk_seq(data[:MAX_USAGE_SCAN_BYTES]))
        self._prefilled()
        if b'"usage"' not in data:
            return
        for line in reversed(data[-MAX_USAGE_SCAN_BYTES:].split(b"\n")):
            usage = _usage(line.removeprefix(b"data: ").strip())
            if usage is not None:
                self._actual, seq = usage
                self._note_seq(seq)
                return

    def _note_seq(self, seq: int | None) -> None:
        engine = self.engines.get(self._sent_to) if self._sent_to is not None else None
        if seq is not None and engine is not None and self.settle is not None:
            note_answer(engine, seq, self.settle)

    def release(self) -> None:
        """The request is done with its engine: its work leaves the queue, its hit counts."""
        self._prefilled()
        url, self._sent_to = self._sent_to, None
        engine = self.engines.get(url) if url is not None else None
        if engine is None:
            return
        engine.num_inflight -= 1
        if self._actual is not None and engine.indexed:
            self._observe(engine, self._actual)

    def _observe(self, engine: EngineState, actual: int) -> None:
        stats, predicted = engine.predictions, self.predicted.get(engine.url, 0)
        stats.num_observed += 1
        stats.num_exact += predicted == actual
        stats.num_over += predicted > actual
        stats.predicted_tokens += predicted
        stats.actual_tokens += actual
        stats.prompt_tokens += self.num_prompt_tokens
        if self.log is not None:
            result = "exact" if predicted == actual else "over" if predicted > actual else "under"
            self.log.append({
                "engine": engine.url, "reason": self.reason.value, "result": result,
                "num_prompt_tokens": self.num_prompt_tokens, "predicted_cached_tokens": predicted,
                "expected_cached_tokens": self.expected.get(engine.url, 0),
                # every engine's expected hit and queued uncached tokens when decided: why
                # this engine (the cost model's terms), for benchmarks/routing_misses.py
                "expected_by_engine": dict(self.expected), "queued_by_engine": self.queued,
                "actual_cached_tokens": actual, "chosen": engine.url == self.chosen,
                "settled": self.settled, "id": self.number, "source": self.source,
                "prefill_wait": self.prefill_wait,
                "prefill_wait_seconds": round(self.prefill_wait_seconds, 3),
            })  # fmt: skip

    def _prefilled(self) -> None:
        self._unhold()
        engine = self.engines.get(self._sent_to) if self._sent_to is not None else None
        if engine is not None and self._queued >= 0:
            engine.queued_tokens -= self._queued
            self._queued = -1  # once


def _first_chunk_seq(data: bytes) -> int | None:
    """A streamed answer's first chunk's ``kv_events_seq`` (its prefill's events)."""
    for line in data.split(b"\n"):
        raw = line.removeprefix(b"data: ").strip()
        if raw.startswith(b"{") and b'"kv_events_seq"' in raw and b'"usage"' not in raw:
            try:
                seq = json.loads(raw).get("kv_events_seq")
            except (ValueError, AttributeError):
                return None
            return seq if isinstance(seq, int) and not isinstance(seq, bool) else None
    return None


def _usage(raw: bytes) -> tuple[int, int | None] | None:
    """An answer line's (cached tokens, kv_events_seq), if it holds a usage."""
    if not raw.startswith(b"{"):
        return None
    try:
        usage = json.loads(raw).get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        seq = usage.get("kv_events_seq")
    except (ValueError, AttributeError):
        return None
    if not (isinstance(cached, int) and cached >= 0):
        return None
    return cached, seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def order_engines(
    policy: Policy,
    turn: list[str],
    healthy: dict[str, bool],
    engines: dict[str, EngineState],
    predicted: dict[str, int],
    num_prompt_tokens: int,
) -> list[str]:
    """Every decode engine once, best first. ``turn`` is the round-robin order."""
    position = {url: i for i, url in enumerate(turn)}
    costs = sorted(e.token_seconds for e in engines.values())
    median = costs[len(costs) // 2] if costs else None
    best_hit = max((predicted.get(url, 0) for url in turn if healthy.get(url, True)), default=0)
    busy = sum(e.num_inflight > 0 for e in engines.values()) / max(1, len(engines))

    def load(url: str) -> int:
        state = engines.get(url)
        return state.num_inflight if state is not None else 0

    def key(url: str) -> tuple[float, ...]:
        sick = 0.0 if healthy.get(url, True) else 1.0
        hit = predicted.get(url, 0)
        if policy is Policy.CACHE:
            return (sick, -hit, load(url), position[url])
        if policy is Policy.COST and url in engines:
            recomputed = RECOMPUTE_WEIGHT * busy * max(0, best_hit - hit)
            cost = engines[url].expected_seconds(num_prompt_tokens - hit, median, recomputed)
            return (sick, cost, load(url), position[url])
        return (sick, position[url])

    return sorted(turn, key=key)

"""``RoutingOptions``: the proxy's ``--routing``, ``--events`` and index flags, checked once."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hybridkv.proxy.routing.decision import Policy

MAX_INDEX_BLOCKS = 1 << 26
PREFILL_WAITS = ("auto", "landed")


@dataclass(frozen=True, slots=True)
class RoutingOptions:
    policy: Policy = Policy.COST  # --routing
    # --events: one per --decode engine, in order; "auto": found by the engine's /kv_events
    events: tuple[str, ...] = ()
    index_max_blocks: int = 1_000_000  # --index-max-blocks: keys per engine (LRU past it)
    prefill_skip_tokens: int = 64  # --prefill-skip-tokens: P/D skips prefill at <= this uncached
    tokenize_timeout_seconds: float = 5.0
    cost_interval_seconds: float = 5.0  # between two reads of the engines' /metrics
    # --settle-max-seconds: a decision waits this long at most for an index that lags the
    # engine's answers (settle.py; also capped at 2 s and by the prefill it could save)
    settle_max_seconds: float = 0.25
    # --prefill-wait: "auto": a request whose prefix the chosen engine computes for another
    # is sent at once with the landed hit predicted where that is exact (attention-only
    # engines), else waits until it landed; "landed": always waits (settle.await_prefill)
    prefill_wait: str = "auto"
    prefill_wait_max_seconds: float = 300.0  # --first-byte-timeout: the wait's bound

    def __post_init__(self) -> None:
        if not isinstance(self.policy, Policy):
            raise ValueError(f"--routing must be one of {[p.value for p in Policy]}")
        if not 1 <= self.index_max_blocks <= MAX_INDEX_BLOCKS:
            raise ValueError(f"--index-max-blocks must be in 1..{MAX_INDEX_BLOCKS}")
        if not 0 <= self.prefill_skip_tokens <= 1 << 20:
            raise ValueError("--prefill-skip-tokens must be in 0..1048576")
        if self.prefill_wait not in PREFILL_WAITS:
            raise ValueError(f"--prefill-wait must be one of {list(PREFILL_WAITS)}")
        names = ("tokenize_timeout_seconds", "cost_interval_seconds", "prefill_wait_max_seconds")
        for name in names:
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"routing: {name} must be a finite number > 0, got {value!r}")
        if not (math.isfinite(self.settle_max_seconds) and 0 <= self.settle_max_seconds <= 2):
            raise ValueError("--settle-max-seconds must be in [0, 2]")
        for events in self.events:
            if events not in ("", "auto") and not events.startswith(("tcp://", "ipc://")):
                raise ValueError(f"--events {events!r}: a tcp:// or ipc:// endpoint, or auto")

"""Round robin over prefill and decode engines, which of them answer /health, and the proxy's
routing counters."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

UNHEALTHY_POLL_SECONDS = 0.25


class Outcome(str, Enum):
    DISAGGREGATED = "disaggregated"  # prefilled on a prefill engine, decoded on a decode engine
    COLOCATED = "colocated"  # no prefill engine could: the decode engine did it all
    PREFILL_SKIPPED = "prefill_skipped"  # the decode engine held (almost) the whole prompt
    REFUSED = "refused"  # the prefill engine refused the request: its 4xx went to the client
    FAILED = "failed"  # no decode engine answered, or it failed before its answer was whole


@dataclass(slots=True)
class RoutingStats:
    requests: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(Outcome, 0))
    prefill_failures: dict[str, int] = field(default_factory=dict)  # by engine URL
    decode_failures: dict[str, int] = field(default_factory=dict)


class Router:
    """Engines in turn. An engine whose last /health probe failed is skipped for prefill (the
    decode engine computes the prompt instead) and tried last for decode. Every engine counts
    as healthy until probed."""

    def __init__(self, prefill: list[str], decode: list[str]) -> None:
        if not decode:
            raise ValueError("hybridkv proxy: at least one --decode engine URL is required")
        self.prefill = [u.rstrip("/") for u in prefill]
        self.decode = [u.rstrip("/") for u in decode]
        self.healthy: dict[str, bool] = dict.fromkeys([*self.prefill, *self.decode], True)
        self._answered_at: dict[str, float] = {}  # the last answer bytes from each engine
        self._next_prefill = itertools.count()
        self._next_decode = itertools.count()
        self._lock = threading.Lock()
        self.stats = RoutingStats()

    def prefill_order(self) -> list[str]:
        """Every healthy prefill engine once, starting with the next in turn."""
        return [u for u in _rotated(self.prefill, next(self._next_prefill)) if self.healthy[u]]

    def decode_order(self) -> list[str]:
        """Every decode engine once: the healthy ones first, each group in turn."""
        urls = _rotated(self.decode, next(self._next_decode))
        return sorted(urls, key=lambda u: not self.healthy[u])  # stable: keeps the turn

    async def wait_unhealthy(self, url: str) -> None:
        """Return once ``url`` is marked unhealthy (polled: the monitor marks it)."""
        while self.healthy[url]:
            await asyncio.sleep(UNHEALTHY_POLL_SECONDS)

    def touch(self, url: str) -> None:
        """``url`` sent answer bytes (headers or a chunk): it is alive, if slow."""
        self._answered_at[url] = time.monotonic()

    def answered_within(self, url: str, seconds: float) -> bool:
        at = self._answered_at.get(url)
        return at is not None and time.monotonic() - at <= seconds

    def has_healthy(self, role: str) -> bool:
        return any(self.healthy[u] for u in (self.prefill if role == "prefill" else self.decode))

    def count(self, outcome: Outcome) -> None:
        with self._lock:
            self.stats.requests[outcome] += 1

    def count_failure(self, url: str, prefill: bool) -> None:
        table = self.stats.prefill_failures if prefill else self.stats.decode_failures
        with self._lock:
            table[url] = table.get(url, 0) + 1

    def engines(self) -> Iterator[tuple[str, str]]:
        yield from (("prefill", u) for u in self.prefill)
        yield from (("decode", u) for u in self.decode)


def _rotated(urls: list[str], turn: int) -> list[str]:
    if not urls:
        return []
    k = turn % len(urls)
    return urls[k:] + urls[:k]

"""Round robin over prefill and decode engines, and the proxy's routing counters."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum


class Outcome(str, Enum):
    DISAGGREGATED = "disaggregated"  # prefilled on a prefill engine, decoded on a decode engine
    COLOCATED = "colocated"  # every prefill engine failed: the decode engine did it all
    FAILED = "failed"  # no decode engine answered


@dataclass(slots=True)
class RoutingStats:
    requests: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(Outcome, 0))
    prefill_failures: dict[str, int] = field(default_factory=dict)  # by engine URL
    decode_failures: dict[str, int] = field(default_factory=dict)


class Router:
    def __init__(self, prefill: list[str], decode: list[str]) -> None:
        if not decode:
            raise ValueError("hybridkv proxy: at least one --decode engine URL is required")
        self.prefill = [u.rstrip("/") for u in prefill]
        self.decode = [u.rstrip("/") for u in decode]
        self._next_prefill = itertools.count()
        self._next_decode = itertools.count()
        self._lock = threading.Lock()
        self.stats = RoutingStats()

    def prefill_order(self) -> list[str]:
        """Every prefill engine once, starting with the next in turn."""
        return _rotated(self.prefill, next(self._next_prefill))

    def decode_order(self) -> list[str]:
        return _rotated(self.decode, next(self._next_decode))

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

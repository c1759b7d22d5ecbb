"""Typed connector statistics: what a connector counted, by meaning.

Both halves of a connector return the same ``ConnectorStats`` subclass from ``take_stats()``
(counts since the previous call); the engine adds them up (``merge``) into running totals. The
base fields are the ones ``/metrics`` reads by meaning (failures by reason, bytes and seconds
by tier and direction); a connector's subclass adds its own counters as fields declared with
``counter("name")`` / ``counter("name.{}")``, which ``/metrics`` shows as
``kv_connector_events{name=...}`` (``events()``). A connector built over others keeps each
child's stats under ``children`` (per-child breakdown); totals fold them in (``flatten``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from hybridkv.choice import Choice
from hybridkv.step_io import FailureReason

K = TypeVar("K")


class Direction(Choice):
    STORE = "store"  # device cache -> tier
    LOAD = "load"  # tier -> device cache


def counter(name: str) -> Any:
    """A connector-specific counter field: an int/float named ``name``, or a mapping whose key
    fills ``{}`` in ``name`` (``counter("hits.{}")`` with ``{TierName.CPU: 2}`` -> ``hits.cpu``)."""
    if "{}" in name:
        return field(default_factory=dict, metadata={"event": name})
    return field(default=0, metadata={"event": name})


def bump(counts: dict[K, Any], key: K, value: float = 1) -> None:
    counts[key] = counts.get(key, 0) + value


def _add(into: dict[K, Any], other: Mapping[K, Any]) -> None:
    for key, value in other.items():
        bump(into, key, value)


@dataclass(slots=True)
class ConnectorStats:
    load_failures: dict[FailureReason, int] = field(default_factory=dict)
    offload_bytes: dict[tuple[str, Direction], int] = field(default_factory=dict)
    offload_seconds: dict[tuple[str, Direction], float] = field(default_factory=dict)
    children: dict[str, ConnectorStats] = field(default_factory=dict)

    def merge(self, other: ConnectorStats) -> None:
        """Add ``other`` (the same type) into this one, field by field, children by name."""
        if type(other) is not type(self):
            raise TypeError(f"cannot add {type(other).__name__} to {type(self).__name__}")
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name == "children":
                for name, child in theirs.items():
                    if name in mine:
                        mine[name].merge(child)
                    else:
                        mine[name] = child.copy()
            elif isinstance(mine, dict):
                for key, value in theirs.items():
                    bump(mine, key, value)
            else:
                setattr(self, f.name, mine + theirs)

    def copy(self) -> ConnectorStats:
        fresh = type(self)()
        fresh.merge(self)
        return fresh

    def events(self) -> dict[str, float]:
        """This connector's own counters (not its children's) by their event names; zeros and
        empty mappings are left out."""
        out: dict[str, float] = {}
        for f in fields(self):
            name = f.metadata.get("event")
            value = getattr(self, f.name)
            if name is None:
                continue
            if isinstance(value, Mapping):
                out.update({name.format(k): v for k, v in value.items() if v})
            elif value:
                out[name] = value
        return out

    def flatten(self) -> FlatStats:
        """Self and every descendant folded together (what the totals metrics show)."""
        flat = FlatStats(dict(self.load_failures), dict(self.offload_bytes),
                         dict(self.offload_seconds), self.events())  # fmt: skip
        for child in self.children.values():
            sub = child.flatten()
            _add(flat.load_failures, sub.load_failures)
            _add(flat.offload_bytes, sub.offload_bytes)
            _add(flat.offload_seconds, sub.offload_seconds)
            _add(flat.events, sub.events)
        return flat


@dataclass(slots=True)
class FlatStats:
    load_failures: dict[FailureReason, int]
    offload_bytes: dict[tuple[str, Direction], int]
    offload_seconds: dict[tuple[str, Direction], float]
    events: dict[str, float]


S = TypeVar("S", bound=ConnectorStats)


class StatsCounter(Generic[S]):
    """Thread-safe stats for a connector half whose threads all count; ``take`` drains."""

    def __init__(self, factory: Callable[[], S]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._stats = factory()
        self._update = _Update(self)

    def update(self) -> _Update[S]:
        """``with counter.update() as s: s.timeouts += 1`` (under the lock). A plain context
        manager, not a generator one: a load counts on its hot path, and
        ``contextlib.contextmanager`` cost more than the counting itself (~1.2 of 2.1 µs)."""
        return self._update

    def take(self) -> S:
        with self._lock:
            stats, self._stats = self._stats, self._factory()
        return stats


class _Update(Generic[S]):
    __slots__ = ("_counter",)

    def __init__(self, counter: StatsCounter[S]) -> None:
        self._counter = counter

    def __enter__(self) -> S:
        self._counter._lock.acquire()
        return self._counter._stats

    def __exit__(self, *exc: object) -> None:
        self._counter._lock.release()

"""Eviction order of a tier's units: LRU, and ARC as an option (``Eviction``).

A policy only orders unit keys; the tier decides which candidates may go (never a pinned unit
or one still being stored). ``touch(key, reuse=False)`` only refreshes recency: the scheduler
uses it to keep a prefix's head units more recent than its tail units (it touches a request's
units tail first), so eviction takes tails before heads. ``reuse=True`` marks a real second use
(a hit by another request), which ARC treats as frequency.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator

from hybridkv.choice import Choice


class BaseEvictionPolicy(ABC):
    @abstractmethod
    def insert(self, key: Hashable) -> None:
        """A unit became resident (or was reserved) in the tier."""

    @abstractmethod
    def touch(self, key: Hashable, reuse: bool = False) -> None:
        """Make ``key`` most recent (no-op if unknown)."""

    @abstractmethod
    def remove(self, key: Hashable, evicted: bool) -> None:
        """``key`` left the tier; ``evicted`` if it went to make room (ARC remembers it)."""

    @abstractmethod
    def candidates(self) -> list[Hashable]:
        """Every resident key, first to evict first."""

    def iter_candidates(self) -> Iterator[Hashable]:
        """``candidates`` lazily, without copying (eviction stops as soon as it has room);
        the policy must not change while it is consumed."""
        return iter(self.candidates())


class LRUPolicy(BaseEvictionPolicy):
    def __init__(self, capacity_units: int) -> None:
        self.order: OrderedDict[Hashable, None] = OrderedDict()  # oldest first

    def insert(self, key: Hashable) -> None:
        self.order[key] = None
        self.order.move_to_end(key)

    def touch(self, key: Hashable, reuse: bool = False) -> None:
        if key in self.order:
            self.order.move_to_end(key)

    def remove(self, key: Hashable, evicted: bool) -> None:
        self.order.pop(key, None)

    def candidates(self) -> list[Hashable]:
        return list(self.order)

    def iter_candidates(self) -> Iterator[Hashable]:
        return iter(self.order)


class ARCPolicy(BaseEvictionPolicy):
    """Adaptive replacement: T1 holds units used once, T2 units reused; ghost lists B1/B2
    remember recent evictions from each and move the target size ``p`` of T1 (a B1 ghost
    coming back grows it, a B2 ghost shrinks it)."""

    def __init__(self, capacity_units: int) -> None:
        self.capacity = max(1, capacity_units)
        self.p = 0.0
        self.t1: OrderedDict[Hashable, None] = OrderedDict()
        self.t2: OrderedDict[Hashable, None] = OrderedDict()
        self.b1: OrderedDict[Hashable, None] = OrderedDict()
        self.b2: OrderedDict[Hashable, None] = OrderedDict()

    def insert(self, key: Hashable) -> None:
        if key in self.b1:
            self.p = min(self.capacity, self.p + max(1.0, len(self.b2) / len(self.b1)))
            del self.b1[key]
            self.t2[key] = None
        elif key in self.b2:
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / len(self.b2)))
            del self.b2[key]
            self.t2[key] = None
        else:
            self.t1[key] = None

    def touch(self, key: Hashable, reuse: bool = False) -> None:
        if key in self.t1:
            if reuse:
                del self.t1[key]
                self.t2[key] = None
            else:
                self.t1.move_to_end(key)
        elif key in self.t2:
            self.t2.move_to_end(key)

    def remove(self, key: Hashable, evicted: bool) -> None:
        for resident, ghosts in ((self.t1, self.b1), (self.t2, self.b2)):
            if key in resident:
                del resident[key]
                if evicted:
                    ghosts[key] = None
                    while len(ghosts) > self.capacity:
                        ghosts.popitem(last=False)
                return

    def candidates(self) -> list[Hashable]:
        return list(self.iter_candidates())

    def iter_candidates(self) -> Iterator[Hashable]:
        if self.t1 and (len(self.t1) > self.p or not self.t2):
            return itertools.chain(self.t1, self.t2)
        return itertools.chain(self.t2, self.t1)


class Eviction(Choice):
    """The ``eviction`` option: which policy orders a tier's units."""

    LRU = "lru"
    ARC = "arc"


_POLICIES: dict[Eviction, Callable[[int], BaseEvictionPolicy]] = {
    Eviction.LRU: LRUPolicy,
    Eviction.ARC: ARCPolicy,
}


def create_policy(eviction: Eviction, capacity_units: int) -> BaseEvictionPolicy:
    return _POLICIES[eviction](capacity_units)

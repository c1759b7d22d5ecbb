"""Eviction order of a tier's units (``Eviction``): by value (default), LRU or ARC.

A policy only orders unit keys; the tier decides which candidates may go (never a pinned unit
or one still being stored). ``touch(key, reuse=False)`` only refreshes recency: the scheduler
uses it to keep a prefix's head units more recent than its tail units (it touches a request's
units tail first), so eviction takes tails before heads. ``reuse=True`` marks a real second use
(a hit by another request), which ARC treats as frequency.

``ValuePolicy`` (``eviction: value``, the default) orders units by the checkpoint book's value
model (``kv/checkpoint_value.py``) applied to the tier's own evidence: each unit has a class,
the kind of boundary its end is (``store_planning.UnitKinds``; a unit two resident units
continue becomes a ``JUNCTION``) and the loads that resumed there (0, 1, 2 or more: the
deepest unit a load reads, as the book counts the deepest checkpoint within a hit), and the
tier learns each class's expected reuses with the book's estimator (``ReuseRates``, the same
priors), from its own stores and hits: a tier serves what the device lost, so the device's
evidence does not carry over (a prompt end the device never saw resent is a tier's hit).
Classes go fewest hits first (frequency is the tier's own proof of reuse: a flood of one-shot
prompts never outranks a head that served a hit), then least expected reuses, LRU within a
class. Every unit of a tier holds about the same bytes and saves about ``chunk_tokens`` of
prefill, so no cost term is needed. A unit not used while the tier stored
``AGE_HORIZON`` times its capacity in units is *stale*: it goes first, and never keeps a
newcomer out, so a tier whose workload moved on does not keep yesterday's heads forever.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator

from hybridkv.choice import Choice
from hybridkv.kv.checkpoint_value import ReuseRates
from hybridkv.kv.checkpoints import CheckpointKind

# a unit's class: the kind of boundary its end is, and the loads that resumed there (capped)
UnitClass = tuple[CheckpointKind, int]
MAX_HITS = 2
AGE_HORIZON = 4  # tier capacities of units stored since a unit's last use: it is stale
Rank = tuple[int, float]  # (hits, expected reuses): the smaller is evicted first
STALE: Rank = (-1, 0.0)  # below every newcomer


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

    # -- values (``ValuePolicy``); the other policies rank every unit alike ----------------

    def label(self, key: Hashable, kind: CheckpointKind) -> None:
        """The boundary kind of ``key``'s end, told just before ``key`` is inserted."""
        return None

    def share(self, key: Hashable) -> None:
        """A second resident unit continues ``key``: a head requests share."""
        return None

    def resume(self, key: Hashable) -> None:
        """A load resumed at ``key`` (the deepest unit it read): a hit of its class."""
        return None

    def rank(self, key: Hashable) -> Rank:
        """How much ``key`` is worth keeping (comparable with ``rank_of``)."""
        return (0, 0.0)

    def kind_of(self, key: Hashable) -> CheckpointKind | None:
        """The boundary kind ``key`` was labelled with (None: unknown, or not kept)."""
        return None

    def rank_of(self, kind: CheckpointKind, hits: int) -> Rank:
        """What a unit of that kind and hits is worth keeping."""
        return (0, 0.0)


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


class ValuePolicy(BaseEvictionPolicy):
    """Units by class (the module docstring): stale ones first, then least worth first, LRU
    within a class; ``rates`` learned from the tier's own stores and hits."""

    def __init__(self, capacity_units: int) -> None:
        self.rates = ReuseRates()
        self.horizon = AGE_HORIZON * max(1, capacity_units)
        self.clock = 0  # units inserted so far
        self.classes: dict[UnitClass, OrderedDict[Hashable, int]] = {}  # key -> last use
        self.of: dict[Hashable, UnitClass] = {}
        self._next: tuple[Hashable, CheckpointKind] | None = None  # ``label``'s, for insert

    def label(self, key: Hashable, kind: CheckpointKind) -> None:
        self._next = (key, kind)

    def insert(self, key: Hashable) -> None:
        kind = CheckpointKind.PERIODIC
        if self._next is not None and self._next[0] == key:
            kind = self._next[1]
        self._next = None
        self.clock += 1
        self.rates.offer(kind, 0)
        self._place(key, (kind, 0))

    def touch(self, key: Hashable, reuse: bool = False) -> None:
        cls = self.of.get(key)
        if cls is not None:  # recency only: a hit counts where a load resumes (``resume``)
            self._place(key, cls)

    def resume(self, key: Hashable) -> None:
        cls = self.of.get(key)
        if cls is not None:
            self.rates.reuse(*cls)
            self._place(key, (cls[0], min(cls[1] + 1, MAX_HITS)))

    def share(self, key: Hashable) -> None:
        cls = self.of.get(key)
        if cls is not None and cls[0] in (CheckpointKind.PERIODIC, CheckpointKind.PROMPT):
            self._place(key, (CheckpointKind.JUNCTION, cls[1]))

    def remove(self, key: Hashable, evicted: bool) -> None:
        cls = self.of.pop(key, None)
        if cls is not None:
            self._unplace(key, cls)

    def _place(self, key: Hashable, cls: UnitClass) -> None:
        old = self.of.get(key)
        if old is not None:
            self._unplace(key, old)
        self.classes.setdefault(cls, OrderedDict())[key] = self.clock
        self.of[key] = cls

    def _unplace(self, key: Hashable, cls: UnitClass) -> None:
        members = self.classes[cls]
        del members[key]
        if not members:
            del self.classes[cls]

    def _is_stale(self, key: Hashable) -> bool:
        return self.clock - self.classes[self.of[key]][key] > self.horizon

    def rank(self, key: Hashable) -> Rank:
        return STALE if self._is_stale(key) else self.rank_of(*self.of[key])

    def kind_of(self, key: Hashable) -> CheckpointKind | None:
        cls = self.of.get(key)
        return None if cls is None else cls[0]

    def rank_of(self, kind: CheckpointKind, hits: int) -> Rank:
        return (hits, self.rates.expected(kind, hits))

    def candidates(self) -> list[Hashable]:
        return list(dict.fromkeys(self.iter_candidates()))

    def iter_candidates(self) -> Iterator[Hashable]:
        stale = (itertools.takewhile(self._is_stale, members) for members in self.classes.values())
        ranked = sorted(self.classes, key=lambda c: self.rank_of(*c))
        fresh = (self.classes[c] for c in ranked)
        return itertools.chain(itertools.chain.from_iterable(stale), *fresh)


class Eviction(Choice):
    """The ``eviction`` option: which policy orders a tier's units."""

    VALUE = "value"
    LRU = "lru"
    ARC = "arc"


_POLICIES: dict[Eviction, Callable[[int], BaseEvictionPolicy]] = {
    Eviction.VALUE: ValuePolicy,
    Eviction.LRU: LRUPolicy,
    Eviction.ARC: ARCPolicy,
}


def create_policy(eviction: Eviction, capacity_units: int) -> BaseEvictionPolicy:
    return _POLICIES[eviction](capacity_units)

"""An O(1) free queue over integer ids.

An ``OrderedDict`` keyed by id is a doubly linked list implemented in C: append, prepend
(``move_to_end(last=False)``), remove from the middle and pop from the front are all O(1),
and several times faster than a linked list threaded through Python arrays.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from itertools import islice


class FreeQueue:
    __slots__ = ("_ids",)

    def __init__(self, ids: list[int], capacity: int) -> None:
        self._ids: OrderedDict[int, None] = OrderedDict.fromkeys(ids)

    @property
    def order(self) -> OrderedDict[int, None]:
        """The queue itself (head first), for the pool's bulk loops: ``del order[i]``
        removes, ``order[i] = None`` appends, ``order.move_to_end(i, False)`` prepends."""
        return self._ids

    def head(self, n: int) -> list[int]:
        """The first ``n`` ids, left in the queue."""
        if n > len(self._ids):
            raise IndexError(f"asked for {n} ids, {len(self._ids)} free")
        return list(islice(self._ids, n))

    @property
    def num_free(self) -> int:
        return len(self._ids)

    def __contains__(self, i: int) -> bool:
        return i in self._ids

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def append(self, i: int) -> None:
        self._ids[i] = None

    def prepend(self, i: int) -> None:
        self._ids[i] = None
        self._ids.move_to_end(i, last=False)

    def remove(self, i: int) -> None:
        del self._ids[i]

    def popleft(self) -> int:
        if not self._ids:
            raise IndexError("pop from an empty free queue")
        return self._ids.popitem(last=False)[0]

    def popleft_n(self, n: int) -> list[int]:
        ids = self._ids
        if n > len(ids):
            raise IndexError(f"asked for {n} ids, {len(ids)} free")
        # reading the head then deleting by key is ~2x faster than popitem(last=False)
        out = list(islice(ids, n))
        for i in out:
            del ids[i]
        return out

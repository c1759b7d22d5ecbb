"""An O(1) doubly linked free queue over integer ids, threaded through two arrays."""

from __future__ import annotations

from collections.abc import Iterator


class FreeQueue:
    """Holds ids ``0..capacity-1``; every operation is O(1) except iteration.

    Two sentinels live at indices ``capacity`` (head) and ``capacity + 1`` (tail).
    ``_next[i] == -1`` marks an id that is not in the queue.
    """

    __slots__ = ("_next", "_prev", "_head", "_tail", "num_free")

    def __init__(self, ids: list[int], capacity: int) -> None:
        self._head = capacity
        self._tail = capacity + 1
        self._next = [-1] * (capacity + 2)
        self._prev = [-1] * (capacity + 2)
        self._next[self._head] = self._tail
        self._prev[self._tail] = self._head
        self.num_free = 0
        for i in ids:
            self.append(i)

    def __contains__(self, i: int) -> bool:
        return self._next[i] != -1

    def __iter__(self) -> Iterator[int]:
        i = self._next[self._head]
        while i != self._tail:
            yield i
            i = self._next[i]

    def _link(self, i: int, before: int) -> None:
        after = self._prev[before]
        self._next[after] = i
        self._prev[i] = after
        self._next[i] = before
        self._prev[before] = i
        self.num_free += 1

    def append(self, i: int) -> None:
        self._link(i, self._tail)

    def prepend(self, i: int) -> None:
        self._link(i, self._next[self._head])

    def remove(self, i: int) -> None:
        p, n = self._prev[i], self._next[i]
        self._next[p] = n
        self._prev[n] = p
        self._next[i] = self._prev[i] = -1
        self.num_free -= 1

    def popleft(self) -> int:
        i = self._next[self._head]
        if i == self._tail:
            raise IndexError("pop from an empty free queue")
        self.remove(i)
        return i

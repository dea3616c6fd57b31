"""A hold-back buffer keyed on monotone frontiers.

Causal barriers name direct predecessors only.  At a subscriber each
predecessor ``(key, need)`` is satisfied once a monotone *frontier* for ``key``
reaches ``need``: for a publication ``key`` is its source stream and the
frontier the highest sequence number delivered (or known never to be
deliverable here); for a membership operation ``key`` is the node and the
frontier the newest operation of that node learned.  Because frontiers only
grow, an item's satisfied dependencies never become unsatisfied, and an item
needs to be looked at again only when the frontier it waits on advances.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

Need = tuple[int, int]


class CausalBuffer(Generic[K, T]):
    """Items wait until every ``(key, need)`` they depend on has ``frontier[key] >= need``.

    Invariant: an item is returned by :meth:`add` or :meth:`advance` exactly
    once, and only when all its dependencies hold; items whose dependencies
    hold at once are returned by :meth:`add` without being stored.  Work per
    :meth:`advance` is proportional to the waiters it releases (plus a heap
    operation each), never to the size of the buffer.
    """

    __slots__ = ("_frontier", "_items", "_next", "_waiters")

    def __init__(self) -> None:
        self._frontier: dict[K, Need] = {}
        self._waiters: dict[K, list[tuple[Need, int]]] = {}
        self._items: dict[int, list[object]] = {}  # token -> [item, missing]
        self._next = 0

    def __len__(self) -> int:
        return len(self._items)

    def frontier(self, key: K) -> Need | None:
        """The frontier reached for ``key``, or ``None`` if never advanced."""
        return self._frontier.get(key)

    def satisfied(self, key: K, need: Need) -> bool:
        """Whether the dependency ``(key, need)`` holds now."""
        got = self._frontier.get(key)
        return got is not None and got >= need

    def add(self, item: T, deps: Iterable[tuple[K, Need]]) -> bool:
        """Hold ``item`` until its dependencies hold; ``True`` if they hold already."""
        frontier = self._frontier
        missing = []
        for key, need in deps:
            got = frontier.get(key)
            if got is None or got < need:
                missing.append((key, need))
        if not missing:
            return True
        token = self._next
        self._next += 1
        self._items[token] = [item, len(missing)]
        for key, need in missing:
            heapq.heappush(self._waiters.setdefault(key, []), (need, token))
        return False

    def advance(self, key: K, value: Need) -> list[T]:
        """Raise ``frontier[key]`` to ``value`` and return the items it releases, in order."""
        cur = self._frontier.get(key)
        if cur is not None and cur >= value:
            return []
        self._frontier[key] = value
        heap = self._waiters.get(key)
        released: list[T] = []
        while heap and heap[0][0] <= value:
            _, token = heapq.heappop(heap)
            entry = self._items[token]
            entry[1] = int(entry[1]) - 1  # type: ignore[call-overload]
            if entry[1] == 0:
                del self._items[token]
                released.append(entry[0])  # type: ignore[arg-type]
        if heap is not None and not heap:
            del self._waiters[key]
        return released

    def items(self) -> list[T]:
        """Items still held, oldest first."""
        return [entry[0] for _, entry in sorted(self._items.items())]  # type: ignore[misc]

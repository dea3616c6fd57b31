"""A hold-back buffer keyed on monotone frontiers.

Causal barriers name direct predecessors only.  At a subscriber each
predecessor is a triple ``(stream, incarnation, need)``, satisfied once the
monotone *frontier* of ``(stream, incarnation)`` reaches ``need``: for a
publication the stream is its source and the frontier the highest sequence
number delivered (or known never to be deliverable here), so a
:class:`~causal.MsgId` is its own dependency triple and costs no allocation;
for a membership operation of node ``n`` the stream is ``-n - 1`` and the
frontier the newest operation counter learned.  Because frontiers only grow,
a satisfied dependency never becomes unsatisfied, and an item is looked at
again only when the frontier it waits on advances.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection
from typing import Generic, TypeVar

T = TypeVar("T")

Dep = tuple[int, int, int]
"""``(stream, incarnation, need)``; a :class:`~causal.MsgId` is one."""
_D = TypeVar("_D", bound=Dep)

_RETIRED = 1 << 62

_MET_SLACK = 256
"""How far ``CausalBuffer._met`` may outgrow twice the number of frontiers."""

_Key = int | tuple[int, int]
"""A frontier's key: the stream alone for incarnation 0, else ``(stream, incarnation)``.

One flat dict instead of a dict per stream: a subscriber of a topic with N
sources keeps N frontiers, and a nested dict cost ~230 bytes more each."""


def _key(stream: int, incarnation: int) -> _Key:
    return stream if incarnation == 0 else (stream, incarnation)


def _unkey(key: _Key) -> tuple[int, int]:
    """``(stream, incarnation)`` of a frontier key (:func:`_key` reversed)."""
    return (key, 0) if isinstance(key, int) else key


def op_stream(node: int) -> int:
    """The stream of membership operations of ``node`` (disjoint from sources)."""
    return -node - 1


class CausalBuffer(Generic[T]):
    """Items wait until every dependency ``(s, i, need)`` has ``frontier[s][i] >= need``.

    Invariant: an item is returned by :meth:`add` or :meth:`advance` exactly
    once, and only when all its dependencies hold; items whose dependencies
    hold at once are reported by :meth:`add` without being stored.  Work per
    :meth:`advance` is proportional to the waiters it releases (plus a heap
    operation each), never to the size of the buffer.

    ``_met`` holds dependencies known satisfied: the exact ids passed to
    :meth:`deliver`, and the publication dependencies :meth:`add` found
    satisfied by their frontier.  Since frontiers only grow, each stays
    satisfied for good, so :meth:`add` answers a barrier made only of such
    ids with one C-level subset test (hashing the ids) instead of a frontier
    look-up per entry in Python.  It is only a shortcut: a dependency not in
    ``_met`` is checked against the frontier as before, so ``_met`` may be
    emptied at any time: :meth:`_trim` does so once it holds more than twice
    as many ids as there are frontiers, plus :data:`_MET_SLACK`, which keeps
    its memory O(streams), not O(messages), on a node that lives long.
    """

    __slots__ = ("_frontier", "_items", "_last_met", "_met", "_next", "_waiters")

    def __init__(self) -> None:
        self._frontier: dict[_Key, int] = {}
        self._met: set[Dep] = set()
        self._last_met: Collection[Dep] | None = None
        """The last ``deps`` :meth:`add` found all in ``_met`` (reset when it is emptied):
        a relay asks :meth:`known_met` of the barrier it just added."""
        self._waiters: dict[_Key, list[tuple[int, int]]] = {}
        """Per frontier key, the ``(need, token)`` of every held item waiting on it, a heap."""
        self._items: dict[int, list[object]] = {}  # token -> [item, missing]
        self._next = 0

    def __len__(self) -> int:
        return len(self._items)

    def frontier(self, stream: int, incarnation: int) -> int | None:
        """The frontier reached for ``(stream, incarnation)``, or ``None``."""
        return self._frontier.get(_key(stream, incarnation))

    def satisfied(self, dep: Dep) -> bool:
        """Whether ``dep`` holds now."""
        if dep in self._met:
            return True
        got = self._frontier.get(dep[0] if dep[1] == 0 else (dep[0], dep[1]))
        return got is not None and got >= dep[2]

    def known_met(self, deps: Collection[Dep]) -> bool:
        """Whether every entry of ``deps`` is in ``_met`` (one C-level subset test):
        passed to :meth:`deliver`, or found satisfied by its frontier in
        :meth:`add`.  ``False`` says nothing: ``_met`` may have been emptied."""
        return deps is self._last_met or self._met.issuperset(deps)

    def unmet(self, deps: Collection[_D]) -> Collection[_D]:
        """The entries of ``deps`` not in the met set (:meth:`known_met`), in
        ``deps``' order (a set's order for a frozenset, whose entries keep their
        hashes: none is hashed again)."""
        met = self._met
        if isinstance(deps, frozenset):
            return deps.difference(met)
        return [d for d in deps if d not in met]

    def add(self, item: T, deps: Collection[Dep]) -> bool:
        """Hold ``item`` until its dependencies hold; ``True`` if they hold already.

        ``deps`` is iterated twice when some are not known delivered (a list,
        tuple or frozenset, not an iterator).  The ``_met`` shortcut only runs once a
        delivery was reported through :meth:`deliver` (a caller that names
        publication ids, shared by the messages that depend on them); a caller
        that never does (causal broadcast's fresh clock tuples) pays nothing."""
        met = self._met
        learn = bool(met)
        pending: Collection[Dep] = deps
        if learn:
            if met.issuperset(deps):
                self._last_met = deps
                return True  # the common case: every predecessor was delivered here
            # Usually one or two entries are not met: test membership (C) first
            # and look up the frontier only for those.
            pending = self.unmet(deps)
        frontier = self._frontier
        missing: list[Dep] = []
        for dep in pending:
            stream, inc, need = dep
            got = frontier.get(stream if inc == 0 else (stream, inc))
            if got is None or got < need:
                missing.append(dep)
            elif learn and stream >= 0:  # met without a delivery here (this node's
                met.add(dep)  # own, or skipped): a publication id, so no new object
        if learn:
            self._trim()
        if not missing:
            return True
        token = self._next
        self._next += 1
        self._items[token] = [item, len(missing)]
        waiters = self._waiters
        for stream, inc, need in missing:
            heapq.heappush(
                waiters.setdefault(stream if inc == 0 else (stream, inc), []), (need, token)
            )
        return False

    def advance(self, stream: int, incarnation: int, value: int) -> list[T]:
        """Raise the frontier of ``(stream, incarnation)`` to ``value``; return released items."""
        fkey = stream if incarnation == 0 else (stream, incarnation)  # _key, inlined
        cur = self._frontier.get(fkey)
        if cur is not None and cur >= value:
            return []
        self._frontier[fkey] = value
        heap = self._waiters.get(fkey)
        if heap is None:
            return []
        released: list[T] = []
        while heap and heap[0][0] <= value:
            _, token = heapq.heappop(heap)
            entry = self._items.get(token)
            if entry is None:
                continue  # not held (any more): nothing to count down
            entry[1] = int(entry[1]) - 1  # type: ignore[call-overload]
            if entry[1] == 0:
                del self._items[token]
                released.append(entry[0])  # type: ignore[arg-type]
        if not heap:
            del self._waiters[fkey]
        return released

    def deliver(self, mid: Dep) -> list[T]:
        """``mid`` was delivered: :meth:`advance` its stream to it, and remember it
        as met (the caller's ``mid`` object is kept, no new tuple)."""
        met = self._met
        met.add(mid)
        if len(met) > 2 * len(self._frontier) + _MET_SLACK:  # _trim, inlined (per delivery)
            met.clear()
            self._last_met = None
        return self.advance(mid[0], mid[1], mid[2])

    def waited_on(self, stream: int, incarnation: int) -> bool:
        """Whether some held item waits on the frontier of ``(stream, incarnation)``."""
        return _key(stream, incarnation) in self._waiters

    def _trim(self) -> None:
        """Empty ``_met`` once it holds :data:`_MET_SLACK` more ids than twice the
        frontiers: it refills with what new barriers name (recent ids)."""
        if len(self._met) > 2 * len(self._frontier) + _MET_SLACK:
            self._met.clear()
            self._last_met = None

    def retire_below(self, stream: int, incarnation: int) -> list[T]:
        """Everything of ``stream`` in incarnations older than ``incarnation`` is settled
        (a restarted node's older operations are superseded); release their waiters."""
        released: list[T] = []
        older = [k for k in map(_unkey, self._waiters) if k[0] == stream and k[1] < incarnation]
        for s, inc in older:
            released.extend(self.advance(s, inc, _RETIRED))
        return released

    def settle_above(self, stream: int, incarnation: int, value: int) -> list[T]:
        """Count every wait on ``(stream, incarnation)`` for more than ``value`` as
        met, without moving the frontier (waits up to ``value`` stay); return
        what that releases.  For a stream that ends at ``value`` for good: the
        caller keeps later items from waiting on it again."""
        fkey = _key(stream, incarnation)
        heap = self._waiters.get(fkey)
        if not heap:
            return []
        keep = [w for w in heap if w[0] <= value]
        released: list[T] = []
        for need, token in heap:
            entry = self._items.get(token) if need > value else None
            if entry is None:
                continue
            entry[1] = int(entry[1]) - 1  # type: ignore[call-overload]
            if entry[1] == 0:
                del self._items[token]
                released.append(entry[0])  # type: ignore[arg-type]
        if keep:
            heapq.heapify(keep)
            self._waiters[fkey] = keep
        else:
            del self._waiters[fkey]
        return released

    def withdraw(self, item: object) -> bool:
        """Stop holding ``item`` (the very object :meth:`add` held); ``False`` if
        it is not held.  Its waits lapse: :meth:`advance` skips what no longer
        is in ``_items``, so no heap is touched."""
        for token, entry in self._items.items():
            if entry[0] is item:
                del self._items[token]
                return True
        return False

    def items(self) -> list[T]:
        """Items still held, oldest first."""
        return [entry[0] for _, entry in sorted(self._items.items())]  # type: ignore[misc]

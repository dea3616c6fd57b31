"""A publisher's recent publications, bounded by count, bytes and age.

Each node keeps what it published, per topic, across its incarnations (a
process's numbering, :mod:`p2p.machine._frontier`), so that a subscriber
that was away can ask for it (:mod:`p2p.machine._recovery`).  Invariant: the
entries held never exceed :attr:`HistoryLimits.count` nor, counted by their
payload bytes and :data:`DEP_COST` per dependency, :attr:`HistoryLimits.size`;
the oldest go first, and an entry older than :attr:`HistoryLimits.age` is
never answered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

from causal import MsgId
from p2p.machine._frontier import envelope_of

__all__ = ["DEP_COST", "Deps", "History", "HistoryLimits", "Kept"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryLimits:
    """How much of its own recent publications a node keeps (sized for a Pi:
    at most 4 MiB of payloads).  ``count = 0`` keeps nothing: a subscriber
    that was away is told the exact count it missed, and recovers none."""

    count: int = 1000
    """Most publications kept, over all topics."""
    size: int = 4 * 1024 * 1024
    """Most bytes kept, over all topics: payloads, and :data:`DEP_COST` per
    dependency."""
    age: float = 120.0
    """Seconds a publication is kept."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"history {f.name} must be a number >= 0, got {value!r}")


Deps = tuple[tuple[int, int, int], ...]
"""``(source, epoch, ordinal)``: the publications of other sources on the topic
that its publisher had delivered last when it made a publication (what it
causally follows)."""

DEP_COST = 24
"""Bytes a dependency is counted as, against :attr:`HistoryLimits.size`."""


class Kept(NamedTuple):
    """One kept publication: its id, its payload (envelope first), when it was
    made, what it causally follows, and what it counts against the byte
    bound (what :meth:`History.since` answers)."""

    id: MsgId
    payload: bytes
    at: float
    deps: Deps
    cost: int


class _Run:
    """Publications of one topic kept in one step, oldest first: they share
    their time and dependencies, so they are held as one entry (a publisher
    keeps a whole round without an object per publication)."""

    __slots__ = ("at", "deps", "extra", "ids", "payloads", "topic")

    def __init__(
        self,
        topic: str,
        ids: tuple[MsgId, ...],
        payloads: tuple[bytes, ...],
        at: float,
        deps: Deps,
    ) -> None:
        self.topic = topic
        self.ids = ids
        self.payloads = payloads
        self.at = at
        self.deps = deps
        self.extra = DEP_COST * len(deps)
        """What each publication counts beyond its payload."""

    def cost(self, count: int) -> int:
        """What the oldest ``count`` publications count against the byte bound."""
        return sum(map(len, self.payloads[:count])) + self.extra * count


class History:
    """This node's recent publications (see the module docstring), held as
    runs (:class:`_Run`) in the order they were made."""

    def __init__(self, limits: HistoryLimits) -> None:
        self.limits = limits
        self._topics: dict[str, deque[_Run]] = {}
        self._order: deque[_Run] = deque()
        """Every run held, oldest first (what to evict next)."""
        self._count = 0
        """Publications held, over all runs."""
        self.size = 0
        """Bytes held: payloads and dependencies (:attr:`Kept.cost`)."""

    def __len__(self) -> int:
        return self._count

    def holds(self, topic: str) -> bool:
        """Whether anything published on ``topic`` is held."""
        return topic in self._topics

    def add(self, topic: str, mid: MsgId, payload: bytes, now: float, deps: Deps = ()) -> None:
        """Keep ``payload``, published on ``topic`` as ``mid`` at ``now`` after
        ``deps``; evict the oldest entries until the bounds hold again (one
        larger than the byte bound is not kept)."""
        self.add_many(topic, (mid,), (payload,), now, deps)

    def add_many(
        self,
        topic: str,
        ids: Sequence[MsgId],
        payloads: Sequence[bytes],
        now: float,
        deps: Deps = (),
    ) -> None:
        """:meth:`add` for each of ``payloads`` (published as ``ids``) in order:
        the same entries stay (eviction always takes the oldest first), held
        as one run."""
        if len(ids) != len(payloads):
            raise ValueError(f"{len(ids)} ids for {len(payloads)} payloads")
        if self.limits.count == 0:
            return
        run = _Run(topic, tuple(ids), tuple(payloads), now, deps)
        most = self.limits.size - run.extra
        if max(map(len, run.payloads), default=0) > most:  # larger than the byte bound: not kept
            kept = [(m, p) for m, p in zip(run.ids, run.payloads, strict=True) if len(p) <= most]
            run.ids = tuple(m for m, _ in kept)
            run.payloads = tuple(p for _, p in kept)
        if run.ids:
            runs = self._topics.get(topic)
            if runs is None:
                runs = self._topics[topic] = deque()
            runs.append(run)
            self._order.append(run)
            self._count += len(run.ids)
            self.size += run.cost(len(run.ids))
            self._trim()
        self.expire(now)

    def _trim(self) -> None:
        """Evict the oldest publications until both bounds hold."""
        count, most = self.limits.count, self.limits.size
        while self._count > count or self.size > most:
            run = self._order[0]
            left = len(run.ids)
            drop = min(left, max(self._count - count, 0))
            size = self.size - run.cost(drop)
            while drop < left and size > most:
                size -= len(run.payloads[drop]) + run.extra
                drop += 1
            self._count -= drop
            self.size = size
            if drop == left:
                self._evict()
            else:  # sliced, so what is evicted is freed: the bytes held stay bounded
                run.ids, run.payloads = run.ids[drop:], run.payloads[drop:]

    def _evict(self) -> None:
        """Drop the oldest run whole (its publications already uncounted)."""
        run = self._order.popleft()
        runs = self._topics[run.topic]
        runs.popleft()
        if not runs:
            del self._topics[run.topic]

    def expire(self, now: float) -> None:
        """Forget what is older than ``age``."""
        age, order = self.limits.age, self._order
        while order and now - order[0].at > age:
            run = order[0]
            self._count -= len(run.ids)
            self.size -= run.cost(len(run.ids))
            self._evict()

    def since(self, topic: str, epoch: int, ordinal: int, now: float) -> list[Kept]:
        """What this node published on ``topic`` after ``(epoch, ordinal)`` and
        still holds, oldest first."""
        self.expire(now)
        after: list[Kept] = []
        runs: Sequence[_Run] = self._topics.get(topic, ())
        for run in reversed(runs):  # the newest first: a resume is usually recent
            for mid, payload in zip(reversed(run.ids), reversed(run.payloads), strict=True):
                if envelope_of(payload) <= (epoch, ordinal):
                    after.reverse()
                    return after
                after.append(Kept(mid, payload, run.at, run.deps, len(payload) + run.extra))
        after.reverse()
        return after

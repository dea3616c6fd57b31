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
    bound (a named tuple: one is made per publication)."""

    id: MsgId
    payload: bytes
    at: float
    deps: Deps
    cost: int


class History:
    """This node's recent publications (see the module docstring)."""

    def __init__(self, limits: HistoryLimits) -> None:
        self.limits = limits
        self._topics: dict[str, deque[Kept]] = {}
        self._order: deque[str] = deque()
        """The topic of every entry held, oldest first (what to evict next)."""
        self.size = 0
        """Bytes held: payloads and dependencies (:attr:`Kept.cost`)."""

    def __len__(self) -> int:
        return len(self._order)

    def holds(self, topic: str) -> bool:
        """Whether anything published on ``topic`` is held."""
        return topic in self._topics

    def add(self, topic: str, mid: MsgId, payload: bytes, now: float, deps: Deps = ()) -> None:
        """Keep ``payload``, published on ``topic`` as ``mid`` at ``now`` after
        ``deps``; evict the oldest entries until the bounds hold again (one
        larger than the byte bound is not kept)."""
        limits = self.limits
        cost = len(payload) + DEP_COST * len(deps)
        if limits.count == 0 or cost > limits.size:
            return
        kept = self._topics.get(topic)
        if kept is None:
            kept = self._topics[topic] = deque()
        kept.append(Kept(mid, payload, now, deps, cost))
        self._order.append(topic)
        self.size += cost
        while len(self._order) > limits.count or self.size > limits.size:
            self._evict()
        self.expire(now)

    def add_many(
        self,
        topic: str,
        ids: Sequence[MsgId],
        payloads: Sequence[bytes],
        now: float,
        deps: Deps = (),
    ) -> None:
        """:meth:`add` for each of ``payloads`` (published as ``ids``) in order,
        evicting at the end (the same entries stay: eviction always takes the
        oldest first)."""
        limits = self.limits
        if limits.count == 0:
            return
        kept = self._topics.get(topic)
        if kept is None:
            kept = self._topics[topic] = deque()
        extra, order, size, most = DEP_COST * len(deps), self._order, self.size, limits.size
        new = tuple.__new__  # Kept(...), without the named tuple's Python-level __new__
        for mid, payload in zip(ids, payloads, strict=True):
            cost = len(payload) + extra
            if cost > most:
                continue
            kept.append(new(Kept, (mid, payload, now, deps, cost)))
            order.append(topic)
            size += cost
        if not kept:
            del self._topics[topic]
        topics, count = self._topics, limits.count
        while len(order) > count or size > most:  # _evict, inlined: once per publication
            oldest = order.popleft()
            held = topics[oldest]
            size -= held.popleft().cost
            if not held:
                del topics[oldest]
        self.size = size
        self.expire(now)

    def _evict(self) -> None:
        topic = self._order.popleft()
        kept = self._topics[topic]
        self.size -= kept.popleft().cost
        if not kept:
            del self._topics[topic]

    def expire(self, now: float) -> None:
        """Forget what is older than ``age``."""
        age = self.limits.age
        order = self._order
        while order and now - self._topics[order[0]][0].at > age:
            self._evict()

    def since(self, topic: str, epoch: int, ordinal: int, now: float) -> list[Kept]:
        """What this node published on ``topic`` after ``(epoch, ordinal)`` and
        still holds, oldest first."""
        self.expire(now)
        kept = self._topics.get(topic)
        if not kept:
            return []
        after = []
        for entry in reversed(kept):  # the newest first: a resume is usually recent
            if envelope_of(entry.payload) <= (epoch, ordinal):
                break
            after.append(entry)
        after.reverse()
        return after

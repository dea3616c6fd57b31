"""Exchanges with seeds: the schedule a node keeps with each address it was
given (``p2p node --seed``), sans-IO.

A node that knows only a seed's address sends it its records, asking for the
seed's own, at once and then every ``interval`` (the fleet a seed knows
grows); an exchange that fails (the seed is down, unreachable) is tried
again after a backoff that doubles from ``first_backoff`` up to
``interval``.  The driver carries out :class:`ExchangeWithSeed` (a
connection of its own in the runtime, a control message in the simulator)
and reports how it went (:meth:`Seeds.reached` / :meth:`Seeds.failed`).

Invariant: each seed has exactly one exchange scheduled or under way, so a
dead seed costs one attempt per backoff, never a burst.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2p.wire import Leave
from vcube._hot import hot


@hot
class ExchangeWithSeed:
    """Send ``records`` (this node's first) to the seed at ``address``, asking
    for its own; report the outcome to ``seed_reached`` or ``seed_failed``."""

    address: str
    records: tuple[bytes, ...]


@hot
class LeaveSeed:
    """Tell the seed at ``address`` that this node leaves (``msg``): the seed
    learnt this node, but its own record never came back, so no LEAVE to the
    members reached it and it would suspect a node that left."""

    address: str
    msg: Leave


@dataclass(slots=True)
class _Seed:
    due: float | None
    """When the next exchange starts (``None``: one is under way)."""
    backoff: float
    node: int | None = None
    """The node the seed turned out to be (known once an exchange reached it)."""


class Seeds:
    """The exchange schedule of every seed address (see the module docstring)."""

    def __init__(self, interval: float, first_backoff: float = 0.25) -> None:
        if not interval > 0 or not first_backoff > 0:
            raise ValueError("seed interval and backoff must be positive")
        self.interval = interval
        self.first_backoff = min(first_backoff, interval)
        self._seeds: dict[str, _Seed] = {}

    def add(self, address: str, now: float) -> None:
        """A seed address: its first exchange is due at once (a second add changes nothing)."""
        if address not in self._seeds:
            self._seeds[address] = _Seed(now, self.first_backoff)

    def deadline(self) -> float | None:
        """When the next exchange is due (``None``: none scheduled)."""
        return min((s.due for s in self._seeds.values() if s.due is not None), default=None)

    def due(self, now: float) -> list[str]:
        """The addresses whose exchange is due at ``now``, in address order; each
        is under way from now on until its outcome is reported."""
        ready = sorted(a for a, s in self._seeds.items() if s.due is not None and s.due <= now)
        for address in ready:
            self._seeds[address].due = None
        return ready

    def reached(self, address: str, node: int, now: float) -> None:
        """The exchange with ``address`` went out (it is ``node``): the next one in
        ``interval``, the backoff back to its start.  ``node`` this very node
        (the list names it) ends the schedule."""
        seed = self._seeds.get(address)
        if seed is None:
            return
        seed.node, seed.backoff = node, self.first_backoff
        seed.due = now + self.interval

    def failed(self, address: str, now: float) -> None:
        """The exchange with ``address`` failed: again after the backoff, doubled
        for the next failure (up to ``interval``)."""
        seed = self._seeds.get(address)
        if seed is None:
            return
        seed.due = now + seed.backoff
        seed.backoff = min(seed.backoff * 2, self.interval)

    def drop(self, address: str) -> None:
        """No more exchanges with ``address`` (it is this node's own)."""
        self._seeds.pop(address, None)

    def met(self) -> dict[int, str]:
        """The seeds reached at least once, by the node each turned out to be."""
        return {s.node: a for a, s in self._seeds.items() if s.node is not None}

    def under_way(self) -> list[str]:
        """The addresses never reached whose first exchange is under way: the seed
        may have learnt this node already, its outcome not yet reported."""
        return sorted(a for a, s in self._seeds.items() if s.due is None and s.node is None)

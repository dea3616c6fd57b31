"""Membership records spread over the authenticated overlay (DESIGN.md §5), sans-IO.

Discovery is a hint that reaches only some members: a node on a network
without multicast knows its seed only, a node whose mDNS packets are lost is
seen by some members and not by others.  So signed membership records also
travel between members, over the fleet's authenticated connections:

* **Introductions**: the first frame of every connection a node dials carries
  its own record, so whoever it talks to can answer it (``p2p.runtime._link._Link``).
* **News**: a record new to a node is passed once to its overlay neighbours.
* **Anti-entropy** (:class:`RecordGossip`): each detector round, a node tells
  the nodes its detector monitors a digest of the records it holds
  (:func:`records_digest`), when the digest changed since it last told them
  and otherwise every ``refresh`` seconds.  A receiver that holds a different
  set answers with all its records and asks for the sender's, so both end up
  with the union.

Why this converges: the monitored nodes include ``FIRSTCHILD(i, s)`` for every
non-empty cluster of ``i``'s view, so when nobody learns anything new any
more, every node ``w`` that ``i`` knows is reached from ``i`` by a chain of
monitored edges whose ends agree (each VCube tree spans the view of its root);
a disagreeing edge would have synced.  Each node that knows another therefore
holds the same set as that node, and since a record names its sender, the
"knows" relation is symmetric: every connected group of members agrees.
After the last change, that takes at most the depth of the trees in rounds
(about ``log2 N``): an answer held back for ``resync`` is only ever a
repeat of one already given for the same pair of digests.

Nothing here reads a clock or does I/O: every method takes ``now``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Peer", "RecordGossip", "records_digest"]


@dataclass(frozen=True, slots=True)
class Peer:
    """A verified peer: where to dial it, and the record that proved it."""

    node_id: int
    host: str
    port: int
    record: bytes
    issued_at: int = 0
    """The record's signing time (seconds): a newer record of a node replaces an older one."""


def records_digest(records: Iterable[bytes]) -> int:
    """An order-independent 64-bit digest of a set of distinct records
    (XOR of their BLAKE2b-64 hashes): equal sets give equal digests."""
    digest = 0
    for record in records:
        digest ^= int.from_bytes(hashlib.blake2b(record, digest_size=8).digest(), "big")
    return digest


class RecordGossip:
    """When to send a membership digest, and when to answer one with records.

    Invariants: a target is told the current digest at most once until the
    digest changes or ``refresh`` seconds pass; a sender whose digest differs
    from ours is answered with our records once per change of either digest,
    and otherwise at most once per ``resync`` seconds (so two nodes whose
    views disagree only through the detector, which the records cannot fix,
    do not exchange every round).
    """

    __slots__ = ("_answered", "_refresh", "_resync", "_told")

    def __init__(self, *, refresh: float, resync: float) -> None:
        if refresh <= 0 or resync < 0:
            raise ValueError(f"need refresh > 0 and resync >= 0, got {refresh} and {resync}")
        self._refresh = refresh
        self._resync = resync
        self._told: dict[int, tuple[int, float]] = {}
        self._answered: dict[int, tuple[tuple[int, int], float]] = {}

    def due(self, targets: Iterable[int], digest: int, now: float) -> list[int]:
        """The ``targets`` to send ``digest`` to now (and records them as told)."""
        out = []
        for target in targets:
            told = self._told.get(target)
            if told is None or told[0] != digest or now - told[1] >= self._refresh:
                self._told[target] = (digest, now)
                out.append(target)
        return out

    def answer(self, sender: int, theirs: int, mine: int, now: float) -> bool:
        """Whether to answer ``sender``'s digest ``theirs`` with our records:
        when the two differ, and either of them changed since our last answer
        to ``sender`` or ``resync`` seconds passed.  A changed digest is new
        knowledge on one side, so its answer is never held back (holding it
        back stalled convergence until the next ``refresh``: a sender whose
        digest stopped changing never asked again); a disagreement that
        stays the same is answered once per ``resync``."""
        if theirs == mine:
            return False
        last = self._answered.get(sender)
        if last is not None and last[0] == (theirs, mine) and now - last[1] < self._resync:
            return False
        self._answered[sender] = ((theirs, mine), now)
        return True

    def forget(self, node: int) -> None:
        """``node`` left or crashed: its next incarnation starts afresh."""
        self._told.pop(node, None)
        self._answered.pop(node, None)

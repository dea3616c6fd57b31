"""Ordinals and delivery frontiers: what a subscriber misses is counted, never silent.

Every publication carries, ahead of the application's bytes, an envelope of
two unsigned 64-bit big-endian integers: the *epoch* of its source's
numbering (the incarnation its process started as) and its *ordinal*, the
number of publications the source made on the topic before it in that epoch.
A new incarnation taken while the process lives (a suspicion refuted, a
healed partition) keeps the epoch and numbers on, so a subscriber can count
across it; a restarted process starts a new epoch at 0.

A subscriber keeps, per topic and source, the envelope it delivered last
(its *frontier*), across its own incarnations.  A delivery past the next
ordinal follows publications it will not get: :meth:`Frontier.delivered`
returns their count, once, before that delivery reaches the application.
Invariant: per topic and source the frontier only moves forward, and the
count returned for a delivery is the number of ordinals strictly between it
and the frontier (or, at a source's new epoch, the ordinals before it).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from topics import PubMessage

__all__ = ["ENVELOPE_SIZE", "GAP", "SKIP", "Frontier", "envelope_of"]

_ENVELOPE = struct.Struct(">QQ")
_unpack = _ENVELOPE.unpack_from
ENVELOPE_SIZE = _ENVELOPE.size
"""Bytes the envelope adds ahead of the application's payload."""


SKIP = -1
""":meth:`Frontier.delivered`: at or behind the frontier (delivered, or counted
as missed, already): not to be handed to the application again."""
GAP = -2
""":meth:`Frontier.delivered` with ``hold``: past the next ordinal; the
frontier did not move (the caller may first ask for what lies between)."""


def envelope_of(payload: bytes) -> tuple[int, int]:
    """The ``(epoch, ordinal)`` a publication's payload starts with."""
    epoch: int
    ordinal: int
    epoch, ordinal = _unpack(payload)
    return epoch, ordinal


class Frontier:
    """This node's ordinals as a publisher and its frontiers as a subscriber
    (see the module docstring)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self._next: dict[str, int] = {}
        """Per topic, the ordinal of this node's next publication."""
        self._last: dict[str, dict[int, tuple[int, int]]] = {}
        """Per topic and source, the envelope delivered last."""
        self._older: dict[tuple[str, int], tuple[int, int]] = {}
        """Per topic and source whose epoch moved on here, the envelope of the
        previous epoch delivered last: the older process's publications that
        the core delivers late (they waited for their causal past) are each
        handed on once."""
        self.missed = 0
        """Publications counted as missed, over all topics and sources."""
        self.changes = 0
        """How many times a frontier moved (a driver that keeps them durably
        writes when this changed)."""

    def envelope(self, topic: str) -> bytes:
        """The envelope of this node's next publication on ``topic``; the ordinal
        is taken only by :meth:`published` (a publication the core refuses
        takes none, or a subscriber would count it as missed)."""
        return _ENVELOPE.pack(self.epoch, self._next.get(topic, 0))

    def published(self, topic: str, count: int = 1) -> None:
        """The publication :meth:`envelope` announced was accepted (``count``:
        that many, those :meth:`envelopes` announced)."""
        self._next[topic] = self._next.get(topic, 0) + count

    def enveloped(self, topic: str, payloads: Sequence[bytes]) -> list[bytes]:
        """``payloads`` as this node's next publications on ``topic``, each behind
        its envelope (the ordinals taken only by :meth:`published`, as
        :meth:`envelope`'s)."""
        first, epoch, pack = self._next.get(topic, 0), self.epoch, _ENVELOPE.pack
        return [pack(epoch, first + i) + p for i, p in enumerate(payloads)]

    def delivered(self, topic: str, source: int, payload: bytes, hold: bool = False) -> int:
        """Record the delivery of a publication of ``source`` (never this node's
        own) with ``payload``; return how many of its source's publications on
        ``topic`` the subscriber will not get before it (0 for the first
        delivery of a source on a topic: a subscription is not owed what came
        before it), or :data:`SKIP` for one at or behind the frontier (not to
        be delivered), or, with ``hold``, :data:`GAP` instead of a count
        above 0 (the frontier is left where it was)."""
        epoch, ordinal = _unpack(payload)
        mine = self._last.get(topic)
        if mine is None:
            mine = self._last[topic] = {}
        last = mine.get(source)
        if last is not None:
            last_epoch, last_ordinal = last
            if epoch == last_epoch and ordinal == last_ordinal + 1:  # the usual case
                mine[source] = (epoch, ordinal)
                self.changes += 1
                return 0
            if epoch < last_epoch:
                return self._late(topic, source, epoch, ordinal)
            missed = _between(last, epoch, ordinal)
            if missed < 0:
                return SKIP
            if missed and hold:
                return GAP
            if epoch > last_epoch:
                self._older[(topic, source)] = last
            mine[source] = (epoch, ordinal)
            self.changes += 1
            self.missed += missed
            return missed
        mine[source] = (epoch, ordinal)
        self.changes += 1
        return 0

    def delivered_run(self, topic: str, source: int, messages: Sequence[PubMessage]) -> bool:
        """:meth:`delivered` for each of ``messages`` (of ``source``, in order) where
        each is its usual case (the publication right after the last one
        delivered, in the same epoch); ``False``, with nothing changed, if one
        is not (or lacks the envelope): the caller takes them one by one."""
        mine = self._last.get(topic)
        last = None if mine is None else mine.get(source)
        if last is None:
            return False
        epoch, ordinal = last
        for m in messages:
            payload = m.payload
            if len(payload) < ENVELOPE_SIZE:
                return False
            e, o = _unpack(payload)
            if e != epoch or o != ordinal + 1:
                return False
            ordinal = o
        assert mine is not None
        mine[source] = (epoch, ordinal)
        self.changes += len(messages)
        return True

    def _late(self, topic: str, source: int, epoch: int, ordinal: int) -> int:
        """A publication of the source's previous epoch after its new epoch began
        here (the core held it for its causal past, or its round was slow):
        handed on once, past the newest of the older epochs delivered (0
        missed: what those lost was counted when the new one began);
        :data:`SKIP` for one at or behind it."""
        older = self._older.get((topic, source))
        if older is not None and (epoch, ordinal) <= older:
            return SKIP
        self._older[(topic, source)] = (epoch, ordinal)
        return 0

    def position(self, topic: str, source: int) -> tuple[int, int] | None:
        """The envelope of ``source`` on ``topic`` delivered last (``None``: none)."""
        mine = self._last.get(topic)
        return None if mine is None else mine.get(source)

    def behind(self, topic: str, source: int, payload: bytes) -> bool:
        """Whether a publication with ``payload`` lies past the next ordinal of
        its source (what :meth:`delivered` would count as missed); no change."""
        last = self.position(topic, source)
        return last is not None and _between(last, *_unpack(payload)) > 0

    def forget(self, topic: str) -> None:
        """The application left ``topic``: a later subscription starts afresh."""
        for key in [k for k in self._older if k[0] == topic]:
            del self._older[key]
        if self._last.pop(topic, None) is not None:
            self.changes += 1

    def frontiers(self) -> dict[str, dict[int, tuple[int, int]]]:
        """The subscriber's frontiers: topic -> source -> (epoch, ordinal); the
        live table, to read (and write to disk) at once, never to change."""
        return self._last

    def restore(self, frontiers: dict[str, dict[int, tuple[int, int]]]) -> None:
        """Take ``frontiers`` (of :meth:`frontiers`, kept by a process that ended)
        as this node's: what it delivered before its restart."""
        self._last = {topic: dict(per) for topic, per in frontiers.items()}


def _between(last: tuple[int, int], epoch: int, ordinal: int) -> int:
    """Ordinals strictly between the frontier ``last`` and ``(epoch, ordinal)``
    (at a source's new epoch, the ordinals before it); -1 at or behind it."""
    last_epoch, last_ordinal = last
    if epoch == last_epoch:
        return ordinal - last_ordinal - 1 if ordinal > last_ordinal else -1
    return ordinal if epoch > last_epoch else -1  # a restarted source, or an older one's

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

__all__ = ["ENVELOPE_SIZE", "Frontier", "envelope_of"]

_ENVELOPE = struct.Struct(">QQ")
_unpack = _ENVELOPE.unpack_from
ENVELOPE_SIZE = _ENVELOPE.size
"""Bytes the envelope adds ahead of the application's payload."""


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

    def published(self, topic: str) -> None:
        """The publication :meth:`envelope` announced was accepted."""
        self._next[topic] = self._next.get(topic, 0) + 1

    def delivered(self, topic: str, source: int, payload: bytes) -> int:
        """Record the delivery of a publication of ``source`` (never this node's
        own) with ``payload``; return how many of its source's publications on
        ``topic`` the subscriber will not get before it (0 for the first
        delivery of a source on a topic: a subscription is not owed what came
        before it)."""
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
            return self._jump(mine, source, last, epoch, ordinal)
        mine[source] = (epoch, ordinal)
        self.changes += 1
        return 0

    def _jump(
        self,
        mine: dict[int, tuple[int, int]],
        source: int,
        last: tuple[int, int],
        epoch: int,
        ordinal: int,
    ) -> int:
        """:meth:`delivered` past the next ordinal, or behind the frontier."""
        last_epoch, last_ordinal = last
        if epoch == last_epoch:
            if ordinal <= last_ordinal:
                return 0  # an older publication delivered late: already counted
            missed = ordinal - last_ordinal - 1
        elif epoch > last_epoch:
            missed = ordinal  # a restarted source: its new numbering up to here
        else:
            return 0  # a late publication of an older process of the source
        mine[source] = (epoch, ordinal)
        self.changes += 1
        self.missed += missed
        return missed

    def forget(self, topic: str) -> None:
        """The application left ``topic``: a later subscription starts afresh."""
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

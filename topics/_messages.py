"""Packets exchanged by VCube-PS nodes (thesis §5.5.1), as frozen dataclasses.

Every packet belongs to a *round*: one traversal of a spanning tree rooted at
the round's source, acknowledged by an ACK wave that climbs the same tree.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from causal import MsgId
from vcube._hot import cached, hot


@dataclass(frozen=True, slots=True, order=True)
class RoundId:
    """One tree traversal started by ``source``; numbers never repeat per incarnation."""

    source: int
    incarnation: int
    number: int

    def __repr__(self) -> str:
        return f"R<{self.source}.{self.incarnation}.{self.number}>"


@hot
class ViewEntry:
    """The newest membership operation of ``node`` on a topic (``<n, o, rc>`` of §5.5.1)."""

    node: int
    incarnation: int
    rc: int
    subscribed: bool

    @property
    def op_id(self) -> MsgId:
        return MsgId(self.node, self.incarnation, self.rc)

    def newer_than(self, other: ViewEntry | None) -> bool:
        return other is None or (self.incarnation, self.rc) > (other.incarnation, other.rc)


@hot
class Bound:
    """``node``'s publications with ``seq < first_owned`` precede a subscription.

    Reported on the ACK wave of a SUB: they are not causally after the
    subscription, so the new subscriber never delivers them and never waits
    for them.
    """

    node: int
    incarnation: int
    first_owned: int


DEP_SET_MIN = 8
"""Barriers from this many ids up are tested as sets (:meth:`PubMessage.dep_lookup`)."""


@hot
class PubMessage:
    """One publication with its causal barrier.

    ``deps`` are the publications and ``op_deps`` the membership operations
    that directly precede it on its topic; ``prev`` makes per-source FIFO
    delivery explicit even when the previous publication left the barrier.
    ``op_joins`` says which of ``op_deps`` are subscriptions, so that a
    publication carries whole the ops it names: a receiver that never heard
    of one (an unsubscription made before it joined, whose round went to the
    subscribers of the time) learns it here instead of waiting for it.
    """

    id: MsgId
    payload: bytes
    deps: tuple[MsgId, ...] = ()
    op_deps: tuple[MsgId, ...] = ()
    prev: int = -1
    """Sequence number of the source's previous publication on the topic (-1: none)."""
    op_joins: int = 0
    """Bit ``i`` is set when ``op_deps[i]`` is a subscription, clear for an unsubscription."""
    _dep_set: frozenset[MsgId] | None = cached()

    def dep_set(self) -> frozenset[MsgId]:
        """``deps`` as a set, built on first use and kept (the message is immutable).

        A set's entries keep their hashes, so set-to-set tests (``issuperset``,
        ``difference_update``) hash no id again: a barrier of 38 ids (1024
        nodes all publishing) is tested three times per reception, and each
        test over the tuple hashes every id anew."""
        found = self._dep_set
        if found is None:
            found = frozenset(self.deps)
            object.__setattr__(self, "_dep_set", found)
        return found

    def dep_lookup(self) -> tuple[MsgId, ...] | frozenset[MsgId]:
        """``deps`` in the form cheapest to test against sets: the tuple while
        short (a set costs more to build than a few hashes), else :meth:`dep_set`."""
        deps = self.deps
        return deps if len(deps) < DEP_SET_MIN else self.dep_set()

    def chains_on(self, before: MsgId) -> bool:
        """Whether this publication follows ``before`` in its stream and names
        nothing else (barrier and ``prev``), no op: a chain's follower, sent in
        short form on the wire and delivered in a run (``topics._runs``)."""
        deps, mid = self.deps, self.id
        return (
            not self.op_deps
            and self.prev == before[2]
            and len(deps) == 1
            and deps[0] == before
            and mid[0] == before[0]
            and mid[1] == before[1]
        )

    def named_ops(self) -> Iterator[ViewEntry]:
        """The membership ops this publication names, whole (see ``op_joins``)."""
        joins = self.op_joins
        for i, o in enumerate(self.op_deps):
            yield ViewEntry(o.source, o.incarnation, o.seq, bool(joins >> i & 1))


def chain_end(messages: Sequence[PubMessage], start: int) -> int:
    """The end of the chain from ``messages[start]`` (``start >= 1``): the first
    index from ``start`` on whose publication does not follow the one before it
    (:meth:`PubMessage.chains_on`, and a higher sequence number), else
    ``len(messages)``."""
    before = messages[start - 1].id
    end, n = start, len(messages)
    while end < n:  # chains_on, inlined (3-5 % of a subscriber's CPU as a call)
        m = messages[end]
        deps, mid = m.deps, m.id
        if (
            m.op_deps
            or m.prev != before[2]
            or len(deps) != 1
            or deps[0] != before
            or mid[0] != before[0]
            or mid[1] != before[1]
            or mid[2] <= before[2]
        ):
            break
        before = mid
        end += 1
    return end


@hot
class PubRound:
    """PUB: a batch of one source's publications on a subscriber-only tree.

    ``dests`` are the other subscribers of the receiver's sub-cube: the
    receiver forwards to them (source routing), subscribed or not.
    """

    round: RoundId
    topic: str
    messages: tuple[PubMessage, ...]
    dests: tuple[int, ...]
    kind: Literal["PUB"] = "PUB"


@hot
class Sub:
    """SUB: a subscription, spread to every overlay node on the all-node tree."""

    round: RoundId
    topic: str
    op: ViewEntry
    kind: Literal["SUB"] = "SUB"


@hot
class Uns:
    """UNS: an unsubscription, spread on the subscriber-only tree like PUB.

    Also an *announce* (a subscribed op, no ``dests``: ``VCubePS.joined``),
    which carries the announcer's ``predates`` and ``beyond`` (as
    :attr:`Ack.predates` and :attr:`Ack.beyond`)."""

    round: RoundId
    topic: str
    op: ViewEntry
    dests: tuple[int, ...]
    predates: tuple[Bound, ...] = ()
    beyond: tuple[Bound, ...] = ()
    kind: Literal["UNS"] = "UNS"


@hot
class Ack:
    """ACK: the receiver's whole sub-tree has the round.

    For a SUB round it also carries the membership gathered from the sub-tree
    (``view``), the publishers' :class:`Bound` s for the new subscription, and
    ``predates``: per source stream, a sequence number below which the
    sub-tree had received (or skipped) publications of that stream before it
    acknowledged, so those predate the subscription (read as a :class:`Bound`
    that only skips: ``first_owned`` is one past the newest of them).

    An announce's ACK (and the announce itself) carries the member's frontier
    as ``predates``, and as ``beyond`` the streams where it stopped only at a
    gap (a predecessor that never reached the member), with how far it would
    reach past the gaps: the newcomer takes that if it received nothing of the
    stream below it (``VCubePS._frontier``).
    """

    round: RoundId
    topic: str
    view: tuple[ViewEntry, ...] = ()
    bounds: tuple[Bound, ...] = ()
    predates: tuple[Bound, ...] = ()
    beyond: tuple[Bound, ...] = ()
    kind: Literal["ACK"] = "ACK"


FENCE_ASK, FENCE_QUERY, FENCE_ANSWER, FENCE_DECIDED, FENCE_DECISION = range(5)
"""The steps of a :class:`Fence` (``topics._fence``)."""


@hot
class Fence:
    """FENCE: agreement on where a crashed source's stream ends (``topics._fence``).

    ``stream`` is ``(source, incarnation, value)``: the stream, and the
    sequence number the step is about (an answer, a decision; -1 for none,
    or for an ASK and a QUERY).  ``messages`` are the stream's publications
    of its last round up to ``value`` (an answer's or a decision's);
    ``others`` the publications of other crashed sources the sender holds
    (an answer's, gathered into the decision's), which may precede the
    publications given up.  ``marks`` say how far the own stream on the
    topic of each member that answered had come when it answered,
    ``(member, incarnation, last sequence number published)``: an answer's
    its sender's, a decision's all of them, since any publication of those
    streams that the given-up ones followed is at or below its mark.
    ``round`` names the sender's life, ``RoundId(sender, incarnation, 0)``: a
    FENCE belongs to no tree traversal and is never acknowledged.
    """

    round: RoundId
    topic: str
    stream: MsgId
    step: int
    messages: tuple[PubMessage, ...] = ()
    others: tuple[PubMessage, ...] = ()
    marks: tuple[MsgId, ...] = ()
    kind: Literal["FENCE"] = "FENCE"


Packet = PubRound | Sub | Uns | Ack | Fence


@hot
class Bundle:
    """Packets for one neighbour that must leave together (a causal-aggregation release).

    Link-level only: a driver unpacks a bundle and hands each packet to the
    receiving core in order; cores never receive a bundle.
    """

    packets: tuple[Packet, ...]
    kind: Literal["BUNDLE"] = "BUNDLE"


ID_BYTES = 2
"""Bytes per node id in the size model (the thesis' dense ids, §4.5.3)."""


def _messages_size(messages: tuple[PubMessage, ...]) -> int:
    size = 0
    for m in messages:  # a loop, not sum(): most rounds carry one publication
        size += len(m.payload) + ID_BYTES + 8 + 4 * (len(m.deps) + len(m.op_deps))
    return size


def wire_size(packet: Packet) -> int:
    """Bytes of ``packet`` under the thesis' cost model (a model, not the runtime's CBOR).

    Ids cost 2 bytes, counters 4; a publication costs its payload, its id and
    4 bytes per barrier entry; a route (``dests``) costs an id per node.
    """
    head = ID_BYTES + 4 + len(packet.topic)
    if isinstance(packet, PubRound):
        return head + ID_BYTES * len(packet.dests) + _messages_size(packet.messages)
    if isinstance(packet, Sub):
        return head + 8
    if isinstance(packet, Fence):  # a stream (an id and a counter), a step, publications
        marks = ID_BYTES * len(packet.marks)
        return head + ID_BYTES + 9 + marks + _messages_size(packet.messages + packet.others)
    if isinstance(packet, Uns):
        extra = len(packet.predates) + len(packet.beyond)
        return head + 8 + ID_BYTES * len(packet.dests) + 8 * extra
    extra = len(packet.predates) + len(packet.beyond)
    return head + 8 * (len(packet.view) + len(packet.bounds) + extra)

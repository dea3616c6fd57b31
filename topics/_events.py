"""Outputs of the VCube-PS core: packets to send and events for the application."""

from __future__ import annotations

from causal import MsgId
from topics._messages import Bundle, Packet, PubMessage
from vcube._hot import hot


@hot
class Send:
    """Send ``packet`` to node ``dest``."""

    dest: int
    packet: Packet | Bundle


@hot
class Delivered:
    """A publication is handed to the application, in causal order per topic;
    ``deps``: the publications it directly follows (its causal barrier), so
    a driver that could get one of those later from elsewhere (a resume)
    knows it must not hand that one on after this one."""

    topic: str
    id: MsgId
    payload: bytes
    own: bool = False
    deps: tuple[MsgId, ...] = ()


@hot
class DeliveredRun:
    """Publications of one stream, each naming only the one before it (a
    round's chain, ``topics._runs``), received and delivered in order in one
    step: what a :class:`Received` then a :class:`Delivered` for each of
    ``messages`` say (:meth:`expand`), without an event per publication."""

    topic: str
    messages: tuple[PubMessage, ...]

    def expand(self) -> list[Delivered | Received]:
        """The per-publication events this run stands for, in order."""
        topic = self.topic
        out: list[Delivered | Received] = []
        for m in self.messages:
            out.append(Received(topic, m.id, False))
            out.append(Delivered(topic, m.id, m.payload, False, m.deps))
        return out


@hot
class Received:
    """A publication arrived (before any causal hold-back).

    ``relay`` is true when this node is not subscribed to the topic: it only
    forwards the message (a *false positive* in the thesis' terms).
    """

    topic: str
    id: MsgId
    relay: bool


@hot
class Published:
    """The local application's publication was accepted."""

    topic: str
    id: MsgId


@hot
class PublishedRun:
    """This node's publications ``messages`` on ``topic``, accepted in one step
    (``VCubePS.publish_many``): what a :class:`Published` then an own
    :class:`Delivered` for each say (:meth:`expand`)."""

    topic: str
    messages: tuple[PubMessage, ...]

    def expand(self) -> list[Published | Delivered]:
        """The per-publication events this run stands for, in order."""
        topic = self.topic
        out: list[Published | Delivered] = []
        for m in self.messages:
            out.append(Published(topic, m.id))
            out.append(Delivered(topic, m.id, m.payload, own=True))
        return out


@hot
class Subscribed:
    """The ACK wave of this node's SUB came back: the subscription is confirmed.

    From now on every publication made anywhere reaches this node.
    """

    topic: str


@hot
class RoundAcked:
    """Every subscriber the round was sent to has it (the ACK wave came back)."""

    topic: str
    kind: str
    ids: tuple[MsgId, ...]


@hot
class Dropped:
    """Publications received but never delivered, with the reason (no silent loss)."""

    topic: str
    count: int
    reason: str


@hot
class Held:
    """Causal aggregation: a round's packet for ``child`` was held back on reception.

    ``ids`` are the round's publications; the child could not deliver the first
    of them before a predecessor this node has not received yet and will
    forward to it.
    """

    topic: str
    child: int
    ids: tuple[MsgId, ...]


Event = (
    Delivered
    | DeliveredRun
    | Received
    | Published
    | PublishedRun
    | Subscribed
    | RoundAcked
    | Dropped
    | Held
)
Output = Send | Event

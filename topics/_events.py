"""Outputs of the VCube-PS core: packets to send and events for the application."""

from __future__ import annotations

from dataclasses import dataclass

from causal import MsgId
from topics._messages import Bundle, Packet


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``packet`` to node ``dest``."""

    dest: int
    packet: Packet | Bundle


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Received:
    """A publication arrived (before any causal hold-back).

    ``relay`` is true when this node is not subscribed to the topic: it only
    forwards the message (a *false positive* in the thesis' terms).
    """

    topic: str
    id: MsgId
    relay: bool


@dataclass(frozen=True, slots=True)
class Published:
    """The local application's publication was accepted."""

    topic: str
    id: MsgId


@dataclass(frozen=True, slots=True)
class Subscribed:
    """The ACK wave of this node's SUB came back: the subscription is confirmed.

    From now on every publication made anywhere reaches this node.
    """

    topic: str


@dataclass(frozen=True, slots=True)
class RoundAcked:
    """Every subscriber the round was sent to has it (the ACK wave came back)."""

    topic: str
    kind: str
    ids: tuple[MsgId, ...]


@dataclass(frozen=True, slots=True)
class Dropped:
    """Publications received but never delivered, with the reason (no silent loss)."""

    topic: str
    count: int
    reason: str


@dataclass(frozen=True, slots=True)
class Held:
    """Causal aggregation: a round's packet for ``child`` was held back on reception.

    ``ids`` are the round's publications; the child could not deliver the first
    of them before a predecessor this node has not received yet and will
    forward to it.
    """

    topic: str
    child: int
    ids: tuple[MsgId, ...]


Event = Delivered | Received | Published | Subscribed | RoundAcked | Dropped | Held
Output = Send | Event

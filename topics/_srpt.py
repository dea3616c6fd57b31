"""SRPT: the single-root-per-topic baseline of thesis §5.6, as a sans-IO core.

Each topic has one rendezvous root: the overlay member XOR-closest to a
salted hash of the topic (so the choice is pseudo-random, the same at every
node, and reproducible from the run's seed).  Subscriptions register at the
root; a publisher sends its publication to the root (the extra hop), and the
root disseminates it on its own VCube tree over *all* overlay nodes, pruned to
the branches that hold subscribers.  Non-subscribers on those branches relay
(the thesis' false positives).

This is a performance baseline for the simulator: it delivers on reception and
does not order publications causally, and it has no ACK waves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from causal import MsgId
from topics._config import PubSubConfig
from topics._errors import (
    AlreadySubscribedError,
    LocalProtocolError,
    NotSubscribedError,
    RemoteProtocolError,
)
from topics._events import Delivered, Output, Published, Received, Send, Subscribed
from topics._messages import Ack, Packet, PubMessage, PubRound, RoundId, Sub, Uns, ViewEntry
from vcube import Hypercube, cluster

if TYPE_CHECKING:
    import random


def srpt_root(overlay: Hypercube, topic: str, salt: bytes = b"") -> int:
    """The root of ``topic``: the member XOR-closest to a salted hash of it."""
    digest = hashlib.blake2b(salt + topic.encode(), digest_size=8).digest()
    target = int.from_bytes(digest, "big")
    return min(overlay, key=lambda m: m ^ target)


class SRPTNode:
    """One node of the single-root-per-topic baseline (same driver API as VCubePS)."""

    def __init__(
        self,
        node_id: int,
        *,
        overlay: Hypercube,
        config: PubSubConfig | None = None,
        rng: random.Random | None = None,
        incarnation: int = 0,
        salt: bytes = b"",
    ) -> None:
        self.id = node_id
        self.incarnation = incarnation
        self.overlay = overlay
        self.config = config or PubSubConfig()
        self.rng = rng
        self.salt = salt
        self.pending_max = 0  # SRPT holds nothing back
        self._counter = 0
        self._subscribed: set[str] = set()
        self._members: dict[str, set[int]] = {}  # only at roots

    def __repr__(self) -> str:
        return f"SRPTNode(id={self.id}, subscribed={sorted(self._subscribed)})"

    def root(self, topic: str) -> int:
        return srpt_root(self.overlay, topic, self.salt)

    def is_subscribed(self, topic: str) -> bool:
        return topic in self._subscribed

    def idle(self) -> bool:
        return True

    def preset_subscription(
        self, topic: str, subscribers: Iterable[int], *, shared: object = None
    ) -> None:
        """Oracle start: the root knows ``subscribers``; members are subscribed."""
        subscribers = set(subscribers)
        if self.id in subscribers:
            self._subscribed.add(topic)
        if self.root(topic) == self.id:
            self._members[topic] = set(subscribers)

    def _op(self, topic: str, subscribed: bool) -> ViewEntry:
        self._counter += 1
        return ViewEntry(self.id, self.incarnation, self._counter, subscribed)

    def subscribe(self, topic: str, now: float) -> list[Output]:
        if topic in self._subscribed:
            raise AlreadySubscribedError(f"node {self.id} is already subscribed to {topic!r}")
        self._subscribed.add(topic)
        root = self.root(topic)
        if root == self.id:
            self._members.setdefault(topic, set()).add(self.id)
            return [Subscribed(topic)]
        rid = RoundId(self.id, self.incarnation, self._counter)
        return [Send(root, Sub(rid, topic, self._op(topic, True)))]

    def unsubscribe(self, topic: str, now: float) -> list[Output]:
        if topic not in self._subscribed:
            raise NotSubscribedError(f"node {self.id} is not subscribed to {topic!r}")
        self._subscribed.discard(topic)
        root = self.root(topic)
        if root == self.id:
            self._members.get(topic, set()).discard(self.id)
            return []
        rid = RoundId(self.id, self.incarnation, self._counter)
        return [Send(root, Uns(rid, topic, self._op(topic, False), ()))]

    def publish(self, topic: str, payload: bytes, now: float) -> list[Output]:
        if topic not in self._subscribed:
            raise NotSubscribedError(f"node {self.id} must subscribe to {topic!r} to publish")
        if len(payload) > self.config.max_payload:
            raise LocalProtocolError(f"payload exceeds max_payload={self.config.max_payload}")
        self._counter += 1
        msg = PubMessage(MsgId(self.id, self.incarnation, self._counter), bytes(payload))
        out: list[Output] = [Published(topic, msg.id), Delivered(topic, msg.id, msg.payload, True)]
        rid = RoundId(self.id, self.incarnation, self._counter)
        root = self.root(topic)
        if root == self.id:
            out.extend(self._disseminate(topic, rid, msg))
        else:
            out.append(Send(root, PubRound(rid, topic, (msg,), ())))
        return out

    def _disseminate(self, topic: str, rid: RoundId, msg: PubMessage) -> list[Output]:
        dests = self._members.get(topic, set()) - {self.id, msg.id.source}
        return self._forward(PubRound(rid, topic, (msg,), tuple(sorted(dests))))

    def _forward(self, packet: PubRound) -> list[Output]:
        """Route ``packet.dests`` down this node's all-node tree (relays included)."""
        buckets: dict[int, list[int]] = {}
        for y in packet.dests:
            buckets.setdefault(cluster(self.id, y), []).append(y)
        out: list[Output] = []
        for s in sorted(buckets):
            child = self.overlay.first_child(self.id, s)
            if child is None:
                continue
            share = tuple(y for y in buckets[s] if y != child)
            out.append(Send(child, PubRound(packet.round, packet.topic, packet.messages, share)))
        return out

    def receive(self, sender: int, packet: Packet, now: float) -> list[Output]:
        topic = packet.topic
        if isinstance(packet, Sub | Uns):
            if self.root(topic) != self.id:
                raise RemoteProtocolError(f"{packet.kind} for {topic!r} sent to a non-root")
            members = self._members.setdefault(topic, set())
            if isinstance(packet, Sub):
                members.add(packet.op.node)
                return [Send(sender, Ack(packet.round, topic))]
            members.discard(packet.op.node)
            return []
        if isinstance(packet, Ack):
            return [Subscribed(topic)]
        if not isinstance(packet, PubRound):
            raise RemoteProtocolError(f"unknown packet {packet!r}")
        if self.root(topic) == self.id and sender == packet.round.source:
            out: list[Output] = []
            for msg in packet.messages:
                out.extend(self._on_msg(topic, msg))
                out.extend(self._disseminate(topic, packet.round, msg))
            return out
        out = []
        for msg in packet.messages:
            out.extend(self._on_msg(topic, msg))
        out.extend(self._forward(packet))
        return out

    def _on_msg(self, topic: str, msg: PubMessage) -> list[Output]:
        if msg.id.source == self.id:
            return []
        if topic in self._subscribed:
            return [Received(topic, msg.id, False), Delivered(topic, msg.id, msg.payload)]
        return [Received(topic, msg.id, True)]

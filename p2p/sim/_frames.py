"""Link packets of the simulator, and the causal-broadcast core behind the ``Core`` API.

A :class:`Frame` is what crosses a simulated link: one or more protocol
packets (*parts*) for the same neighbour, under the thesis' MTU and size
model.  Its size is the header plus its parts.
"""

from __future__ import annotations

from typing import cast

from causal import (
    BroadcastConfig,
    BroadcastDelivered,
    BroadcastOutput,
    BroadcastReceived,
    CausalBroadcast,
    HeldBack,
    MessageSet,
    MsgId,
    PacketLimits,
    Transmit,
)
from p2p.machine import ExchangeWithSeed, SendExchange
from p2p.wire import Body, Control, PeerExchange
from topics import (
    Bundle,
    Delivered,
    Held,
    LocalProtocolError,
    Output,
    Packet,
    Published,
    PubRound,
    Received,
    RemoteProtocolError,
    Send,
    wire_size,
)
from vcube import Hypercube

Part = Packet | MessageSet
"""One protocol packet inside a link packet."""


def parts_of(packet: Packet | Bundle | MessageSet) -> list[Part]:
    """The protocol packets a core's send carries (a bundle unpacked)."""
    if isinstance(packet, Bundle):
        return list(packet.packets)
    return [packet]


def part_size(part: Part) -> int:
    """Bytes of one part under the thesis' cost model."""
    if isinstance(part, MessageSet):
        return sum(m.size for m in part.messages)
    return wire_size(part)


def part_messages(part: Part) -> int:
    """Application messages a part carries (control packets count as one)."""
    if isinstance(part, MessageSet):
        return len(part.messages)
    return 1


def frame_ids(frame: Frame) -> tuple[MsgId, ...]:
    """Ids of the application messages (publications, broadcasts) in ``frame``."""
    ids: list[MsgId] = []
    for part in frame.parts:
        if isinstance(part, (MessageSet, PubRound)):
            ids.extend(m.id for m in part.messages)
    return tuple(ids)


class Frame:
    """One link packet.  Mutable only until its transmission starts (``start``)."""

    __slots__ = ("parts", "size", "start")

    def __init__(self, parts: list[Part], header: int = 20, body: int | None = None) -> None:
        """``body``, if given, is the parts' total size (the caller measured them)."""
        self.parts = parts
        self.size = header + (sum(part_size(p) for p in parts) if body is None else body)
        self.start = 0.0

    def __repr__(self) -> str:
        return f"Frame({len(self.parts)} parts, {self.size} B)"

    @property
    def kind(self) -> str:
        """The parts' kind when they share one, else ``MIXED``."""
        kinds = {p.kind for p in self.parts}
        return kinds.pop() if len(kinds) == 1 else "MIXED"


def pack_frames(parts: list[Part], limits: PacketLimits) -> list[Frame]:
    """``parts`` in link packets, in order: :func:`causal.pack` made into
    :class:`Frame` s, measuring each part once (the simulator's hot path)."""
    frames: list[Frame] = []
    current: list[Part] = []
    used = 0
    room, header = limits.room, limits.header
    for part in parts:
        size = part_size(part)
        if current and used + size > room:
            frames.append(Frame(current, header, used))
            current, used = [], 0
        current.append(part)
        used += size
    if current:
        frames.append(Frame(current, header, used))
    return frames


def join_frame(last: Frame, parts: list[Part], limits: PacketLimits) -> list[Part]:
    """Add to ``last`` the leading parts that fit its MTU; return the others."""
    taken = 0
    for part in parts:
        size = part_size(part)
        if last.size + size > limits.mtu:
            break
        last.parts.append(part)
        last.size += size
        taken += 1
    return parts[taken:]


class BroadcastCore:
    """Runs :class:`~causal.CausalBroadcast` (Algorithm 2) behind the simulator's API.

    Causal broadcast has no subscriptions: every node delivers every message.
    A scenario's topic is only a label for the trace, kept in ``topics`` (shared
    by the run's nodes, so a delivery is reported under its publication's topic).
    """

    def __init__(
        self,
        node_id: int,
        *,
        overlay: Hypercube,
        config: BroadcastConfig,
        topics: dict[MsgId, str],
    ) -> None:
        self.id = node_id
        self.core = CausalBroadcast(node_id, overlay=overlay, config=config)
        self._topics = topics

    def subscribe(self, topic: str, now: float) -> list[Output]:
        raise LocalProtocolError("causal-broadcast has no subscriptions: every node delivers all")

    def unsubscribe(self, topic: str, now: float) -> list[Output]:
        raise LocalProtocolError("causal-broadcast has no subscriptions: every node delivers all")

    def is_subscribed(self, topic: str) -> bool:
        return True

    def idle(self) -> bool:
        return self.core.idle()

    @property
    def pending_max(self) -> int:
        return self.core.pending_max

    def publish(self, topic: str, payload: bytes, now: float) -> list[Output]:
        out = self.core.broadcast(payload, now)
        first = out[0]
        assert isinstance(first, BroadcastDelivered)
        self._topics[first.id] = topic
        return [Published(topic, first.id), *self._convert(out)]

    def receive(self, sender: int, packet: object, now: float) -> list[Output]:
        if not isinstance(packet, MessageSet):
            raise RemoteProtocolError(f"causal-broadcast got a {type(packet).__name__}")
        return self._convert(self.core.receive(sender, packet, now))

    def _convert(self, outputs: list[BroadcastOutput]) -> list[Output]:
        out: list[Output] = []
        for o in outputs:
            if isinstance(o, Transmit):
                out.append(Send(o.dest, o.packet))  # type: ignore[arg-type]
            elif isinstance(o, BroadcastDelivered):
                out.append(Delivered(self._topics[o.id], o.id, o.payload, o.own))
            elif isinstance(o, BroadcastReceived):
                out.append(Received(self._topics[o.id], o.id, relay=False))
            elif isinstance(o, HeldBack):
                out.append(Held(self._topics[o.id], o.child, (o.id,)))
        return out


__all__ = [
    "BroadcastCore",
    "Frame",
    "Part",
    "frame_ids",
    "join_frame",
    "pack_frames",
    "part_messages",
    "part_size",
    "parts_of",
]


def control_body(msg: object) -> Body:
    """A simulated control item as the frame body the runtime would decode: a
    record exchange travels as ``SendExchange`` itself (a frame's exchange),
    anything else as the frame's one control message."""
    if type(msg) is SendExchange:
        return Body([], exchange=PeerExchange(msg.records, msg.reply))
    if type(msg) is ExchangeWithSeed:  # a seed exchange asks for the seed's records
        return Body([], exchange=PeerExchange(msg.records, True))
    return Body([], control=(cast(Control, msg),))


def packets_body(frame: Frame) -> Body:
    """A simulated link packet's parts as the frame body ``NodeMachine.receive`` takes."""
    return Body(cast(list[Packet], frame.parts))

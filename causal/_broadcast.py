"""Causal broadcast with timer-free aggregation (thesis ch. 4, Algorithm 2), sans-IO.

Every node broadcasts on the VCube spanning tree rooted at itself, over the
sparse-id overlay.  Messages carry vector clocks with Birman's compression:
only the entries that changed since the source's previous broadcast travel
(plus the source's own entry).  A receiver keeps

* ``vector_clock`` (``vc``): per source, how many messages it delivered;
* ``vector_max`` (``vmax``): per source, the longest prefix it has *received*;
* the pending set: received, not yet delivered (a :class:`CausalBuffer`).

**Aggregation (CHECKAGG).**  Node ``i`` holds message ``m`` back from its child
``k`` in ``m``'s tree exactly while some clock entry ``l`` of ``m`` has
``m.vc[l] > vmax[l]`` and ``k`` is also ``i``'s child in ``l``'s tree: ``k``
cannot deliver ``m`` before a message of ``l`` that ``i`` has not received yet,
and ``i`` is the node that will bring it.  When the missing messages arrive,
everything that became sendable to ``k`` leaves in one packet.  Nothing waits
on a timer, and a message is never held from a child that could deliver it.

Compressed clocks and the full condition.  An entry ``l`` missing from ``m``'s
compressed clock equals the same entry of the source's previous message
``p``.  So ``m`` is blocked by an omitted entry exactly when ``p`` is blocked
by it, and ``p`` blocked for ``k`` means ``p`` is not yet sent to ``k``.  Hence
the rule used here, "``m`` is held from ``k`` while a *carried* entry blocks it
or ``p`` has not been sent to ``k``", is the thesis' full-vector condition,
at a cost proportional to the compressed clock rather than to N.

Safety needs no argument (holding a message never breaks causal delivery,
which CHECKDELIVERY alone ensures); liveness: a message held from ``k`` waits
only for messages ``i`` will receive (``i`` is on their tree, links are
reliable), and each release may only release messages that depend on it, so
by induction on causal order every held message is eventually sent, and sent
exactly once per child (the per-child buffer returns an item once).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from causal._buffer import CausalBuffer, Dep
from causal._errors import CausalError
from causal._ids import MsgId
from causal._packing import PacketLimits, pack
from vcube import ID_BITS, Hypercube
from vcube._hot import hot

SOURCE_ID_BYTES = 2
ENTRY_BYTES = 4
"""Thesis §4.5.3: a message costs its payload, a 2-byte source id and 4 bytes
per clock entry (2 for the node, 2 for the counter)."""


class RemoteBroadcastError(CausalError):
    """A packet from a peer broke the protocol or a limit; nothing was changed."""


class LocalBroadcastError(CausalError):
    """The local application misused the broadcast core."""


@hot
class BroadcastMessage:
    """One broadcast: ``clock`` holds the compressed entries ``(node, count)``.

    The source's own entry is ``seq`` (its ``vc[source]`` after broadcasting)
    and is not repeated in ``clock``.
    """

    source: int
    seq: int
    payload: bytes
    clock: tuple[tuple[int, int], ...] = ()

    @property
    def id(self) -> MsgId:
        return MsgId(self.source, 0, self.seq)

    @property
    def size(self) -> int:
        """Bytes on the wire under the thesis' cost model."""
        return len(self.payload) + SOURCE_ID_BYTES + ENTRY_BYTES * (1 + len(self.clock))


@hot
class MessageSet:
    """A packet: one or more messages for the same child (``mSet`` of Algorithm 2)."""

    messages: tuple[BroadcastMessage, ...]
    kind: Literal["MSG"] = "MSG"


@hot
class Transmit:
    """Send ``packet`` to ``dest``."""

    dest: int
    packet: MessageSet


@hot
class BroadcastDelivered:
    """A broadcast handed to the application, in causal order."""

    id: MsgId
    payload: bytes
    own: bool = False


@hot
class BroadcastReceived:
    """A broadcast arrived (before causal hold-back)."""

    id: MsgId


@hot
class HeldBack:
    """``id`` was not forwarded to ``child`` on reception: the child could not deliver it."""

    child: int
    id: MsgId


BroadcastOutput = Transmit | BroadcastDelivered | BroadcastReceived | HeldBack


@dataclass(frozen=True, slots=True, kw_only=True)
class BroadcastConfig:
    """Limits of one causal-broadcast node; every size from outside is bounded."""

    aggregation: bool = True
    limits: PacketLimits = field(default_factory=PacketLimits)
    max_payload: int = 64 * 1024
    max_messages: int = 1024
    max_entries: int = 1 << 16


def _size(msg: BroadcastMessage) -> int:
    return msg.size


def _sent_stream(source: int) -> int:
    """Stream of "sent to this child" progress for ``source`` (disjoint from sources)."""
    return -source - 1


class CausalBroadcast:
    """One node of Algorithm 2 (``aggregation=False``: plain causal broadcast)."""

    def __init__(
        self, node_id: int, *, overlay: Hypercube, config: BroadcastConfig | None = None
    ) -> None:
        if node_id not in overlay:
            raise LocalBroadcastError(f"node {node_id} is not a member of the overlay")
        self.id = node_id
        self.overlay = overlay
        self.config = config or BroadcastConfig()
        self.vc: dict[int, int] = {}
        self.vmax: dict[int, int] = {}
        self._gaps: dict[int, set[int]] = {}
        self._dirty: dict[int, int] = {}
        self._pending: CausalBuffer[BroadcastMessage] = CausalBuffer()
        self._out: dict[int, CausalBuffer[BroadcastMessage]] = {
            k: CausalBuffer() for k in overlay.children_at(node_id, ID_BITS)
        }
        self._kids: dict[int, tuple[int, ...]] = {}
        self.pending_max = 0
        self.held = 0

    def __repr__(self) -> str:
        return f"CausalBroadcast(id={self.id}, aggregation={self.config.aggregation})"

    def idle(self) -> bool:
        """Nothing pending delivery and nothing held back from a child."""
        return not len(self._pending) and not any(len(b) for b in self._out.values())

    def pending(self) -> int:
        """Messages received and not yet delivered (the pending set)."""
        return len(self._pending)

    def kids(self, root: int) -> tuple[int, ...]:
        """``CHILDREN(i, ...)`` in the tree rooted at ``root`` (cached per root)."""
        got = self._kids.get(root)
        if got is None:
            got = self._kids[root] = self.overlay.children(self.id, root)
        return got

    # ------------------------------------------------------------- broadcast

    def broadcast(self, payload: bytes, now: float) -> list[BroadcastOutput]:
        """CO_BROADCAST: deliver locally, send to every child of this node's own tree."""
        if len(payload) > self.config.max_payload:
            raise LocalBroadcastError(
                f"payload of {len(payload)} bytes exceeds max_payload={self.config.max_payload}"
            )
        seq = self.vc.get(self.id, 0) + 1
        self.vc[self.id] = self.vmax[self.id] = seq
        msg = BroadcastMessage(self.id, seq, bytes(payload), tuple(sorted(self._dirty.items())))
        self._dirty.clear()
        out: list[BroadcastOutput] = [BroadcastDelivered(msg.id, msg.payload, own=True)]
        released = self._pending.advance(self.id, 0, seq)
        out.extend(self._deliver(released))
        for buf in self._out.values():
            buf.advance(self.id, 0, seq)
        for k in self.kids(self.id):
            out.extend(self._transmit(k, [msg]))
        return out

    # --------------------------------------------------------------- receive

    def receive(self, sender: int, packet: MessageSet, now: float) -> list[BroadcastOutput]:
        """Handle one packet; raises :class:`RemoteBroadcastError` (state untouched) on garbage."""
        self._check(sender, packet)
        out: list[BroadcastOutput] = []
        for msg in packet.messages:
            out.extend(self._on_message(msg))
        return out

    def _check(self, sender: int, packet: MessageSet) -> None:
        """Validate a whole packet before any state changes."""
        cfg = self.config
        if not isinstance(packet, MessageSet) or not packet.messages:
            raise RemoteBroadcastError(f"empty or unknown packet from {sender}")
        if len(packet.messages) > cfg.max_messages:
            raise RemoteBroadcastError(f"{len(packet.messages)} messages exceed max_messages")
        seen: set[tuple[int, int]] = set()
        for m in packet.messages:
            key = (m.source, m.seq)
            if m.seq < 1 or key in seen or m.seq <= self.vmax.get(m.source, 0):
                raise RemoteBroadcastError(f"message {m.id!r} is malformed or a duplicate")
            if m.seq in self._gaps.get(m.source, ()):
                raise RemoteBroadcastError(f"message {m.id!r} received twice")
            seen.add(key)
            if len(m.payload) > cfg.max_payload or len(m.clock) > cfg.max_entries:
                raise RemoteBroadcastError(f"message {m.id!r} exceeds the size limits")
            if m.source not in self.overlay:
                raise RemoteBroadcastError(f"message {m.id!r} from an unknown source")
            if self.overlay.parent(self.id, m.source) != sender:
                raise RemoteBroadcastError(f"{sender} is not my parent in the tree of {m.source}")
            for node, count in m.clock:
                if node == m.source or count < 1 or node not in self.overlay:
                    raise RemoteBroadcastError(f"message {m.id!r} has a bad clock entry")

    def _on_message(self, msg: BroadcastMessage) -> list[BroadcastOutput]:
        out: list[BroadcastOutput] = [BroadcastReceived(msg.id)]
        advanced = self._received(msg)
        deps: list[Dep] = [(n, 0, c) for n, c in msg.clock]
        if msg.seq > 1:
            deps.append((msg.source, 0, msg.seq - 1))
        if self._pending.add(msg, deps):
            out.extend(self._deliver([msg]))
        self.pending_max = max(self.pending_max, len(self._pending))
        ready: dict[int, list[BroadcastMessage]] = {}
        if self.config.aggregation:
            self._hold_or_send(msg, advanced, ready, out)
        else:
            for k in self.kids(msg.source):
                ready[k] = [msg]
        for k, msgs in ready.items():
            out.extend(self._transmit(k, msgs))
        return out

    def _received(self, msg: BroadcastMessage) -> int:
        """Record the reception (lines 16-18); return the new ``vmax[source]``."""
        src = msg.source
        top = self.vmax.get(src, 0)
        if msg.seq != top + 1:
            self._gaps.setdefault(src, set()).add(msg.seq)
            return top
        top += 1
        gaps = self._gaps.get(src)
        while gaps and top + 1 in gaps:
            top += 1
            gaps.discard(top)
        if gaps is not None and not gaps:
            del self._gaps[src]
        self.vmax[src] = top
        return top

    def _hold_or_send(
        self,
        msg: BroadcastMessage,
        vmax: int,
        ready: dict[int, list[BroadcastMessage]],
        out: list[BroadcastOutput],
    ) -> None:
        """CHECKAGG for every child: release what ``msg`` unblocks, then place ``msg``."""
        for k, buf in self._out.items():
            self._cascade(k, buf, buf.advance(msg.source, 0, vmax), ready)
        for k in self.kids(msg.source):
            buf = self._out[k]
            deps: list[Dep] = [(n, 0, c) for n, c in msg.clock if k in self.kids(n)]
            deps.append((msg.source, 0, msg.seq))
            if msg.seq > 1:
                deps.append((_sent_stream(msg.source), 0, msg.seq - 1))
            if buf.add(msg, deps):
                self._cascade(k, buf, [msg], ready)
            else:
                self.held += 1
                out.append(HeldBack(k, msg.id))

    @staticmethod
    def _cascade(
        k: int,
        buf: CausalBuffer[BroadcastMessage],
        sendable: Iterable[BroadcastMessage],
        ready: dict[int, list[BroadcastMessage]],
    ) -> None:
        """Send ``sendable`` to ``k`` and whatever waited for them to be sent."""
        work = list(sendable)
        while work:
            m = work.pop(0)
            ready.setdefault(k, []).append(m)
            work.extend(buf.advance(_sent_stream(m.source), 0, m.seq))

    def _transmit(self, k: int, msgs: list[BroadcastMessage]) -> list[BroadcastOutput]:
        """One packet per MTU-sized slice of ``msgs`` (a bundle continues in a new packet)."""
        slices = pack(msgs, _size, self.config.limits)
        return [Transmit(k, MessageSet(tuple(s))) for s in slices]

    def _deliver(self, ready: list[BroadcastMessage]) -> list[BroadcastOutput]:
        """CHECKDELIVERY: deliver ``ready`` and everything their delivery unblocks."""
        out: list[BroadcastOutput] = []
        work = list(ready)
        while work:
            m = work.pop(0)
            self.vc[m.source] = m.seq
            if m.source != self.id:
                self._dirty[m.source] = m.seq
            out.append(BroadcastDelivered(m.id, m.payload))
            work.extend(self._pending.advance(m.source, 0, m.seq))
        return out

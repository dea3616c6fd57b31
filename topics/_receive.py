"""Packets from peers: checked against the limits and the protocol, then
handed to the SUB, PUB/UNS round and ACK handlers.

Invariant: a packet that raises :class:`~topics.RemoteProtocolError` has not
changed this node's state (every check comes before the first change).
"""

from __future__ import annotations

from itertools import islice
from operator import attrgetter, lt

from topics._chain import Chain
from topics._errors import RemoteProtocolError
from topics._events import Output
from topics._fence import _Fence
from topics._messages import Ack, Fence, Packet, PubMessage, PubRound, Sub, Uns
from topics._state import (
    REPAIR_ROUNDS,
    StreamKey,
    _Announce,
    _bounds_of,
    _oldest_held,
    _Pending,
    _relay_packets,
    _stream_key,
    _Topic,
)
from vcube import cluster


def _strictly_increasing(ids: tuple[int, ...]) -> bool:
    """Whether ``ids`` is sorted without duplicates (a route is; most have 0 or 1 id).

    Compares neighbours in C, without the set and sorted copy a route near
    the root (hundreds of ids) would cost."""
    return len(ids) < 2 or all(map(lt, ids, islice(ids, 1, None)))


_PAYLOAD = attrgetter("payload")


class _Receive(_Fence):
    """Input from peers (see the module docstring)."""

    def receive(self, sender: int, packet: Packet | object, now: float) -> list[Output]:
        """Handle one packet from ``sender``; raises :class:`RemoteProtocolError` on garbage.

        A packet that raises has not changed this node's state.  Typed as taking
        any object because it does check: the compiled build (``make compiled``)
        would otherwise reject garbage with a ``TypeError`` before this does.
        """
        if isinstance(packet, PubRound):
            return self._on_round(sender, packet, packet.dests, packet.messages)
        if isinstance(packet, Uns):
            return self._on_round(sender, packet, packet.dests, ())
        if isinstance(packet, Sub):
            return self._on_sub(sender, packet)
        if isinstance(packet, Ack):
            return self._on_ack(sender, packet)
        if isinstance(packet, Fence):
            return self._on_fence(sender, packet)
        raise RemoteProtocolError(f"unknown packet type {type(packet).__name__}")

    def _check_remote(self, topic: str, messages: tuple[PubMessage, ...] = ()) -> None:
        """Reject a packet whose sizes break the configured limits (before any state change)."""
        cfg = self.config
        # A topic this node holds passed the same checks when it was created
        # (_topic): encoding its name again on every packet is wasted work.
        state = self._topics.get(topic) if isinstance(topic, str) else None
        if state is None and (
            not isinstance(topic, str) or not topic or len(topic.encode()) > cfg.max_topic_len
        ):
            raise RemoteProtocolError(f"bad topic name {str(topic)[:64]!r}")
        if len(messages) > cfg.max_round_messages:
            raise RemoteProtocolError(f"round of {len(messages)} publications exceeds the limit")
        most_payload, most_barrier = cfg.max_payload, cfg.max_barrier
        # A chain's publications after the first name one each: only sizes to check.
        checked = messages
        chain = type(messages) is Chain and most_barrier >= 1
        if chain and max(map(len, map(_PAYLOAD, messages))) <= most_payload:
            checked = messages[:1]
        for msg in checked:
            if len(msg.payload) > most_payload:
                raise RemoteProtocolError(f"payload of {msg.id!r} exceeds max_payload")
            if len(msg.deps) + len(msg.op_deps) > most_barrier:
                raise RemoteProtocolError(f"causal barrier of {msg.id!r} exceeds max_barrier")
        held = state.kept() if state is not None else 0  # held_back()
        if (
            messages
            and held + len(messages) > cfg.max_held
            and held + self._would_hold(topic, messages) > cfg.max_held
        ):
            raise RemoteProtocolError(f"hold-back buffer of {topic!r} full (max_held)")
        if len(self._pending) >= cfg.max_pending_rounds:
            raise RemoteProtocolError("too many rounds awaiting acknowledgement")

    def _fresh(
        self, last_rx: dict[StreamKey, int], messages: tuple[PubMessage, ...]
    ) -> tuple[tuple[PubMessage, ...], int | None]:
        """The publications of a round not received before, and the stream's new last seq.

        A round carries publications of one stream (its source's, or a crashed
        source's when relayed) in increasing order; anything else is rejected.
        Those at or below what was already received from the stream are
        duplicates of a retransmission or relay, dropped by id: an honest
        stream only ever arrives again as a repeat of a prefix, because its
        rounds are sequential and a source sends a round again only in full.
        Pure: the caller records the result only once every check passed.
        """
        if not messages:
            return (), None
        first = messages[0].id
        source, inc = first.source, first.incarnation
        before = last_rx.get(_stream_key(source, inc), -1)
        if type(messages) is Chain:  # one stream in order: checked when it was built
            prev = messages[-1].id[2]
        else:
            prev = -1
            for msg in messages:
                mid = msg.id  # (source, incarnation, seq), read by index: once per publication
                if mid[0] != source or mid[1] != inc or mid[2] <= prev:
                    raise RemoteProtocolError(f"round mixes streams or is out of order at {mid!r}")
                prev = mid[2]
        last = prev if prev > before else before  # max(), without the call (once per round)
        if first.seq > before:
            return messages, last
        fresh = tuple(m for m in messages if m.id.seq > before)
        self.duplicates += len(messages) - len(fresh)
        return fresh, (last if fresh else None)

    def _on_sub(self, sender: int, packet: Sub) -> list[Output]:
        repair = packet.round.number >= REPAIR_ROUNDS  # a repairer's copy (see _repair_child)
        if sender == self.id or (packet.op.node != packet.round.source and not repair):
            raise RemoteProtocolError(f"malformed SUB from {sender}: {packet!r}")
        if packet.round in self._pending:
            raise RemoteProtocolError(f"round {packet.round!r} received twice")
        self._check_remote(packet.topic)
        state = self._topic(packet.topic)
        out = self._learn(state, packet.op)
        if state.confirmed:
            out.extend(self._new_subscriber(state, packet.op))
            out.extend(self._unblock_predating(state))
        span = cluster(sender, self.id) - 1
        kids = self.overlay.children_at(self.id, span)
        pending = _Pending(packet.topic, "SUB", sender, set(kids), (packet.op.op_id,))
        out.extend(self._forward(packet.round, pending, [(k, packet) for k in kids]))
        return out

    def _on_round(
        self,
        sender: int,
        packet: PubRound | Uns,
        dests: tuple[int, ...],
        messages: tuple[PubMessage, ...],
    ) -> list[Output]:
        if sender == self.id or self.id in dests or not _strictly_increasing(dests):
            raise RemoteProtocolError(f"malformed {packet.kind} from {sender}: {packet.round!r}")
        if packet.round in self._pending:
            raise RemoteProtocolError(f"round {packet.round!r} received twice")
        if isinstance(packet, Uns) and len(packet.predates) > self.config.max_view_entries:
            raise RemoteProtocolError(f"UNS from {sender} carries too many predates")
        self._check_remote(packet.topic, messages)
        known = self._topics.get(packet.topic)
        fenced: tuple[PubMessage, ...] = ()
        whole = messages
        if known is not None and known.fences and messages:
            messages, fenced = self._fence_split(known, messages)
        fresh, last_rx = self._fresh(known.last_rx if known else {}, messages)
        state = known or self._topic(packet.topic)
        if len(messages) < len(whole):
            self._fence_keep(state, whole, messages, fenced)
        out: list[Output] = []
        if fresh and not state.preset:
            self._took(state, fresh)
        if last_rx is not None:  # something new: the newest round of its stream here
            stream = _stream_key(messages[0].id.source, messages[0].id.incarnation)
            # Only then: a relay of an older round, all duplicates, must not
            # replace the newest one as what this node relays at the crash.
            state.last_round[stream] = messages
            if not state.confirmed:
                state.relay_unowed.add(stream)
            elif state.relay_unowed:
                state.relay_unowed.discard(stream)
            state.last_rx[stream] = last_rx
        new_op = False  # an announce that teaches this node the op (see _sync_ack)
        if isinstance(packet, Uns):
            new_op = packet.op.newer_than(state.view.get(packet.op.node))
            out.extend(self._learn(state, packet.op))
            if not packet.dests and packet.op.node == sender:  # an announce of its own
                out.extend(self._dead_rounds_to(state, packet.op))
            if packet.predates and state.subscribed and state.lonely:
                beyond = dict(_bounds_of(packet.beyond))
                out.extend(self._frontier(state, dict(_bounds_of(packet.predates)), beyond))
        single = fresh  # those not delivered in a run (a run's wait for nothing)
        if len(fresh) == 1:  # no chain in it: the most common round of all
            out += self._on_publication(state, fresh[0])
        elif fresh:
            single = self._publications(state, fresh, out)
        if fresh and state.marked:  # kept until streams came up to marks (topics._fence)
            out.extend(self._marks_came(state))
        if fresh and state.confirmed:
            out.extend(self._ask_bounds(state, fresh[:1], single))
            head = fresh[0].id  # one stream: _fence_held looks only at a dead one's
            if self._dead and self._is_dead(head.source, head.incarnation):
                out.extend(self._fence_held(state, fresh))
        if last_rx is not None and self._dead:
            out.extend(self._relay_late(state, messages))
        children = _relay_packets(self.id, packet)
        pending = self._received_pending(sender, packet, children)
        if pending.kind == "SYNC" and not new_op:
            pending.predates = None  # knew this op already: no frontier (_sync_ack)
        if messages and (state.held or (self.config.aggregation and state.confirmed)):
            if not children:
                out.append(self._ack_for(packet.round, pending))
            else:
                self._track(packet.round, pending, children, packet)
            out.extend(self._aggregate(state, messages, children))
            out.extend(self._repair_known_dead(packet.round, pending))
            return out
        out.extend(self._forward(packet.round, pending, children, packet))
        return out

    def _relay_late(self, state: _Topic, messages: tuple[PubMessage, ...]) -> list[Output]:
        """A round brought publications of a source this node already knows
        crashed: its crash relay has left, without them, so they are relayed
        now, as at the crash (:meth:`_relay_dead`).  Without it a round that
        reached its only live holder after that holder heard of the crash
        reached no one else (``bench.failure_fuzz --modes burst``, seed 4:
        node 3 delivered (6, 1), which node 8 never got)."""
        first = messages[0].id
        if not self._is_dead(first.source, first.incarnation):
            return []
        return self._relay_dead(state, _stream_key(first.source, first.incarnation))

    def _ask_bounds(
        self, state: _Topic, firsts: tuple[PubMessage, ...], msgs: tuple[PubMessage, ...]
    ) -> list[Output]:
        """The bounds a confirmed subscription asks for on receiving ``msgs``:
        :meth:`_ask_bound` for each of ``firsts`` (a round's first: the rest
        of a round follows it; at the confirmation, every publication that
        came before it) and :meth:`_ask_dep_bounds` for ``msgs``.  Asked at
        the confirmation too: without it a subscription confirmed late held,
        for good, a publication that came early and whose predecessor never
        came (verify profile, seed 20, nine sparse ids)."""
        out: list[Output] = []
        for msg in firsts:
            out.extend(self._ask_bound(state, msg))
        if not state.preset:
            out.extend(self._ask_dep_bounds(state, msgs))
        return out

    def _ask_bound(self, state: _Topic, first: PubMessage) -> list[Output]:
        """``first`` came in a round of its own stream and is held here for its
        predecessor, which never came (neither delivered nor held), of a live
        source this subscription has no bound for: that predecessor travelled
        in an earlier round, which completed before this one started, so it
        was not sent here and never comes.  Announce
        this subscription to the source, once per subscription, so that its
        ACK brings the bound (:meth:`_synced`; a relay of a dead source's
        round is left to :meth:`_start_stream_at`).

        Found by the verify profile (seed 0, five nodes, liveness): node 3's
        SUB round missed node 0, whose (0, 5), queued before node 3
        subscribed and sent after node 0 learnt of it, names (0, 4); node 3
        held it for good."""
        src, inc = first.id.source, first.id.incarnation
        if first.prev < 0 or not self._may_ask(state, src, inc, first.prev):
            return []
        if _oldest_held(state, src, inc, below=first.prev + 1):
            return []  # it came: it is held for what it waits for
        state.asked.add(src)
        return self._enqueue(state, _Announce(src))

    def _may_ask(self, state: _Topic, src: int, inc: int, seq: int) -> bool:
        """Whether this subscription may announce itself to source ``(src, inc)``
        for the bound that settles its missing ``seq``: another node, alive,
        not asked before, no bound known (what a bound says is owed will
        come), and ``seq`` not delivered or skipped here."""
        return not (
            src == self.id
            or src in state.asked
            or (src, inc) in state.bounds
            or self._is_dead(src, inc)
            or state.buffer.satisfied((src, inc, seq))
        )

    def _ask_dep_bounds(self, state: _Topic, fresh: tuple[PubMessage, ...]) -> list[Output]:
        """:meth:`_ask_bound` for the other streams a held publication of
        ``fresh`` names: a publication of a live source this subscription has
        no bound for, that never came here.  Whether it is owed here only its
        source can say, so the subscription announces itself there, once, and
        the bound in the ACK (:meth:`_sync_bound`) settles it: below the bound
        it predates the subscription, else it is on its way.

        Found by the verify profile (seed 21625, ten nodes, liveness): node 2's
        SUB round missed node 5, whose (5, 3) went to a view without node 2
        and reached the others only after node 2 was confirmed, so no ACK
        carried it as ``predates``; node 9's (9, 1) names it, and node 2 held
        (9, 1) for good."""
        out: list[Output] = []
        for msg in fresh:
            if not msg.deps or state.buffer.satisfied(msg.id) or self._skipped(state, msg):
                continue  # delivered or skipped: nothing waits on it
            for d in msg.deps:
                src, inc = d.source, d.incarnation
                if state.last_rx.get(_stream_key(src, inc), -1) >= d.seq:
                    continue  # it came here
                if self._may_ask(state, src, inc, d.seq):
                    state.asked.add(src)
                    out.extend(self._enqueue(state, _Announce(src)))
        return out

    @staticmethod
    def _received_pending(
        sender: int, packet: PubRound | Uns, children: list[tuple[int, Packet]]
    ) -> _Pending:
        """The record of a received round; an announce (a subscribed op in a
        one-destination UNS round, see :meth:`joined`) is a SYNC, acked with a bound."""
        waiting = {c for c, _ in children}
        if isinstance(packet, Uns) and packet.op.subscribed and not packet.dests:
            return _Pending(packet.topic, "SYNC", sender, waiting, (packet.op.op_id,))
        return _Pending(packet.topic, packet.kind, sender, waiting)

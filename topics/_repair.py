"""Crashes and joins: forget a crashed node, relay its last round, repair the
rounds that waited on it, and announce subscriptions to a node that joins.

Invariant: no round waits on a child known to have crashed: its share goes
to the next correct node of its cluster (:meth:`_Repair._repair_child`), or,
with nobody left there, the round completes without it; a late ACK of a
child repaired away is recognised and ignored (``_stale``).
"""

from __future__ import annotations

from causal import op_stream
from topics._errors import LocalProtocolError
from topics._events import Output, Send
from topics._messages import Packet, PubMessage, PubRound, RoundId, Sub, Uns
from topics._rounds import _Rounds
from topics._state import (
    DEAD_ROUNDS,
    REPAIR_ROUNDS,
    StreamKey,
    _Announce,
    _DeadRound,
    _kept_items,
    _oldest_held,
    _Pending,
    _Relay,
    _stream_of,
    _Topic,
)
from vcube import cluster, partition_sorted


def _keep_dead_round(
    state: _Topic, stream: StreamKey, messages: tuple[PubMessage, ...], relayed: bool
) -> None:
    """Keep a crashed stream's last round, with whom its relay reaches
    (:meth:`VCubePS._dead_rounds_ahead`); the oldest goes beyond DEAD_ROUNDS."""
    view = state.view
    reached = {(n, view[n].incarnation) for n in state.subscribers()} if relayed else set()
    state.dead_rounds[stream] = _DeadRound(messages, reached, relayed)
    if len(state.dead_rounds) > DEAD_ROUNDS:
        del state.dead_rounds[next(iter(state.dead_rounds))]


def _dead_stream(key: StreamKey, node: int, incarnation: int) -> bool:
    """Whether stream ``key`` is one of ``node``'s up to ``incarnation``."""
    source, inc = _stream_of(key)
    return source == node and inc <= incarnation


class _Repair(_Rounds):
    """Failures, repair and joins (see the module docstring)."""

    def crashed(self, node: int, incarnation: int, now: float) -> list[Output]:
        """``node`` (every incarnation up to ``incarnation``) crashed: repair around it.

        The failure detector delivers this fact; the driver has already given
        :meth:`set_overlay` a membership without ``node``.  Every node does:

        * forget it: it leaves every topic's view (so no later tree has it) and
          its membership ops stop being waited for;
        * relay: a subscriber passes on the last round it received from
          ``node`` over its own tree, because that round may not have reached
          everyone (a source has one round in flight per topic, so earlier
          rounds did); receivers drop what they have by id, so every
          publication of ``node`` that some correct subscriber holds reaches
          all of them (agreement);
        * repair: where ``node`` is a child this node still waits for, its
          share of the round goes to the next correct node of its cluster,
          which takes over the whole sub-cube (:meth:`_repair_child`); the ACK
          wave then completes around the crash.

        Idempotent; never raises for a node it does not know.
        """
        if node == self.id:
            raise LocalProtocolError("a node cannot declare itself crashed")
        if self._is_dead(node, incarnation):
            return []
        self._dead[node] = incarnation
        out: list[Output] = []
        for state in self._topics.values():
            out.extend(self._forget(state, node, incarnation))
        for rid, pending in list(self._pending.items()):
            if node in pending.waiting and self._sent_to_life(pending, node) <= incarnation:
                out.extend(self._repair_child(rid, pending, node))
        return out

    @staticmethod
    def _sent_to_life(pending: _Pending, child: int) -> int:
        """The incarnation of ``child`` this node knew when it sent the round (a
        lower bound on the one that got it: a crash of a newer one cannot be it)."""
        return pending.lives.get(child, 0) if pending.lives is not None else 0

    def joined(self, node: int, incarnation: int, now: float) -> list[Output]:
        """``node`` is up as ``incarnation``; any older incarnation of it crashed.

        A node that joins (or comes back) missed the SUB rounds flooded while
        it was not in others' overlays, and a publication that names one of
        those ops would wait for it forever there.  So each subscriber tells
        it its own subscription, in a one-destination round queued behind its
        own operations (so per-source order of ops is kept), acknowledged
        with the newcomer's entry and bound (:meth:`_synced`).
        """
        if node == self.id or incarnation < self._life.get(node, 0):
            return []
        self._life[node] = incarnation
        out = self.crashed(node, incarnation - 1, now) if incarnation > 0 else []
        for state in self._topics.values():
            if state.subscribed:
                out.extend(self._enqueue(state, _Announce(node)))
        return out

    def _forget(self, state: _Topic, node: int, incarnation: int) -> list[Output]:
        """Drop ``node`` from ``state``; release what waited on its ops; relay its last round."""
        entry = state.view.get(node)
        if entry is not None and entry.incarnation <= incarnation:
            state.drop_entry(node)
        out = self._release(state, state.buffer.retire_below(op_stream(node), incarnation + 1))
        if state.confirmed:
            out.extend(self._release(state, self._settle_dead_streams(state, node, incarnation)))
        out.extend(self._flush_held(state))  # holds assume blockers arrive: not any more
        gone = [k for k in state.last_round if _dead_stream(k, node, incarnation)]
        for stream in gone:
            out.extend(self._relay_dead(state, stream))
        return out

    def _relay_dead(self, state: _Topic, stream: StreamKey) -> list[Output]:
        """``stream``'s source crashed: keep its last round received here as a
        dead round, and relay it over this node's tree if it is owed here
        (see :meth:`crashed`)."""
        messages = state.last_round.pop(stream)
        owed = state.subscribed or stream not in state.relay_unowed
        state.relay_unowed.discard(stream)
        relay = owed and any(n != self.id for n in state.subscribers())
        _keep_dead_round(state, stream, messages, relay)
        if not relay:
            return []
        self.relayed += 1
        return self._relay_now(state, _Relay(messages))

    def _settle_dead_streams(self, state: _Topic, node: int, incarnation: int) -> list[PubMessage]:
        """:meth:`_start_stream_at` for the unbounded streams of ``node`` (up to
        ``incarnation``, now crashed) that have publications held here."""
        incs = {m.id.incarnation for m in _kept_items(state)
                if m.id.source == node and m.id.incarnation <= incarnation}  # fmt: skip
        released: list[PubMessage] = []
        for inc in incs - {i for n, i in state.bounds if n == node}:
            oldest = _oldest_held(state, node, inc)
            if oldest is not None and oldest.prev >= 0:  # a stream's first needs no bound
                released.extend(self._start_stream_at(state, oldest))
        return released

    def _repair_child(self, rid: RoundId, pending: _Pending, dead: int) -> list[Output]:
        """Send ``dead``'s share of round ``rid`` to the next correct node of its cluster.

        The share (everything below ``dead`` in the tree) lies in one cluster
        of this node, so its XOR-closest correct member becomes the new child
        and covers the rest, exactly as the tree built without ``dead`` would.
        The copy travels as a repair round ``R'`` of this node (numbered from
        :data:`REPAIR_ROUNDS`, so it never collides with a source's rounds) whose ACK counts
        for ``dead``'s.  Receivers that had the round already drop its
        publications by id and forward it anyway: their own sub-trees may miss it.
        """
        pkt = pending.take_sent(self.id, dead)
        pending.waiting.discard(dead)
        if pkt is not None and pkt.round != rid:
            # ``dead`` held an earlier repair copy: its late ACK is now stale.
            self._repair_of.pop(pkt.round, None)
            self._retire(pkt.round)
        if pending.replaced is None:
            pending.replaced = set()
        pending.replaced.add(dead)
        out: list[Output] = []
        new = self._repair_packet(pkt, dead) if pkt is not None else None
        if new is not None:
            child, packet = new
            self._repair_of[packet.round] = rid
            pending.waiting.add(child)
            pending.set_sent(self.id, child, packet)
            self._note_lives(pending, [child])
            self.repaired += 1
            out.append(Send(child, packet))
        elif not pending.waiting:
            out.extend(self._finish(rid, pending))
        return out

    def _repair_packet(self, pkt: Packet, dead: int) -> tuple[int, Sub | PubRound | Uns] | None:
        """The repair copy of ``pkt`` (sent to ``dead``) and its new receiver, if any is left."""
        self._repairs += 1
        rid = RoundId(self.id, self.incarnation, REPAIR_ROUNDS + self._repairs)
        if isinstance(pkt, Sub):
            child = self.overlay.first_child(self.id, cluster(self.id, dead))
            return None if child is None else (child, Sub(rid, pkt.topic, pkt.op))
        if not isinstance(pkt, PubRound | Uns):
            return None
        share = [d for d in pkt.dests if not self._known_dead(d)]
        if not share:
            return None
        ((child, rest),) = partition_sorted(self.id, share)
        if isinstance(pkt, PubRound):
            return child, PubRound(rid, pkt.topic, pkt.messages, rest)
        return child, Uns(rid, pkt.topic, pkt.op, rest)

    def _retire(self, rid: RoundId) -> None:
        """Remember a repaired round, so late ACKs of repaired-away children are
        ignored rather than blamed on an honest peer (bounded memory)."""
        self._stale.add(rid)
        self._stale_order.append(rid)
        if len(self._stale_order) > self.config.max_pending_rounds:
            self._stale.discard(self._stale_order.popleft())

    def _repair_known_dead(self, rid: RoundId, pending: _Pending) -> list[Output]:
        """Repair at once around children already known to have crashed.

        A source's tree may name a node this node heard crashed (the source
        heard later, or of a newer incarnation this node has not seen): the
        packet still goes to it, harmless if it is down, and its share goes to
        the next correct node too, so the round never waits on a dead child.
        """
        if not self._dead:
            return []
        out: list[Output] = []
        for child in [c for c in pending.waiting if self._known_dead(c)]:
            out.extend(self._repair_child(rid, pending, child))
        return out

"""A source's rounds and the ACK waves that clock them.

Per topic a source's queued operations leave as rounds (a SUB or UNS alone, a
batch of publications, a crashed source's relayed round, an announce); each
node forwards a round to its children, records what each got, and
acknowledges upwards once its whole sub-tree has; SUB ACKs merge views,
bounds and predates on the way.  Invariants: at most one round per topic is
in flight from this source (``_Topic.in_flight``), so receptions from one
source are totally ordered; a round's record (:class:`~topics._state._Pending`)
stays until every child it waits for has acknowledged or been repaired away
(:mod:`~topics._repair`).
"""

from __future__ import annotations

from causal import MsgId
from topics._announce import _Announcing
from topics._chain import chain_of
from topics._errors import RemoteProtocolError
from topics._events import Output, RoundAcked, Send
from topics._messages import Ack, Packet, PubMessage, PubRound, RoundId, Sub, Uns, ViewEntry
from topics._state import (
    DEAD_BOUND,
    QueueItem,
    _Announce,
    _as_bounds,
    _bounds_of,
    _merge_max,
    _Pending,
    _Relay,
    _stream_of,
    _Topic,
)
from vcube import ID_BITS, partition_sorted


class _Rounds(_Announcing):
    """Rounds, forwarding and ACK waves (see the module docstring)."""

    # Defined by _Repair (topics._repair), which builds on these rounds; real
    # methods rather than declarations under TYPE_CHECKING, which mypyc's
    # compiled build does not accept in a class body.
    def _repair_known_dead(self, rid: RoundId, pending: _Pending) -> list[Output]:
        raise NotImplementedError

    def _retire(self, rid: RoundId) -> None:
        raise NotImplementedError

    def _forward(
        self,
        rid: RoundId,
        pending: _Pending,
        children: list[tuple[int, Packet]],
        relayed: PubRound | Uns | None = None,
    ) -> list[Output]:
        """Send a round on to ``children``; a leaf acknowledges at once (lines 48-59)."""
        if not children:
            return [self._ack_for(rid, pending)]
        self._track(rid, pending, children, relayed)
        out: list[Output] = [Send(child, pkt) for child, pkt in children]
        out.extend(self._repair_known_dead(rid, pending))
        return out

    def _track(
        self,
        rid: RoundId,
        pending: _Pending,
        children: list[tuple[int, Packet]],
        relayed: PubRound | Uns | None = None,
    ) -> None:
        """Record ``pending``, what each child got (``children``, or the ``relayed``
        packet they were made from) and which life of it (for :meth:`_repair_child`)."""
        if relayed is None:
            pending.children = children
        else:
            pending.relayed = relayed
        if self._life:
            self._note_lives(pending, [c for c, _ in children])
        self._pending[rid] = pending

    def _note_lives(self, pending: _Pending, children: list[int]) -> None:
        for child in children:
            life = self._life.get(child, 0)
            if life:
                if pending.lives is None:
                    pending.lives = {}
                pending.lives[child] = life

    def _ack_for(self, rid: RoundId, pending: _Pending) -> Send:
        """The ACK this node sends its parent once its whole sub-tree has the round."""
        assert pending.parent is not None
        if pending.kind == "SYNC":
            return self._sync_ack(rid, pending)
        if pending.kind != "SUB":
            return Send(pending.parent, Ack(rid, pending.topic))
        state = self._topic(pending.topic)
        assert pending.view is not None
        assert pending.bounds is not None
        merged = dict(pending.view)
        for node, entry in state.view.items():
            if entry.newer_than(merged.get(node)):
                merged[node] = entry
        bounds = dict(pending.bounds)
        learned = state.learned_at.get(pending.ids[0].source if pending.ids else rid.source)
        if learned is not None:
            # even with nothing published: the subscriber knows it reached this
            # incarnation (see _unreached) and retires older ones (_confirm)
            bounds[(self.id, self.incarnation)] = learned
        for node, inc in self._dead.items():
            # A crashed source reports no bound, and it died before this SUB
            # round completes, so all it published predates the confirmation:
            # none of it is owed to the new subscriber.  Saying so here keeps
            # a subscriber that has not heard of the crash yet from taking
            # the missing bound for "everything is post-subscription".
            bounds[(node, inc)] = DEAD_BOUND
        if state.dead_rounds and pending.ids:
            op = pending.ids[0]  # those bounds settle what the kept dead rounds would
            for dead in state.dead_rounds.values():
                dead.reached.add((op.source, op.incarnation))
        predates = self._predates(state, pending.predates or {}, bounds)
        return Send(
            pending.parent,
            Ack(
                rid,
                pending.topic,
                tuple(merged.values()),
                _as_bounds(bounds),
                _as_bounds(predates),
            ),
        )

    def _predates(
        self,
        state: _Topic,
        below: dict[tuple[int, int], int],
        bounds: dict[tuple[int, int], int],
    ) -> dict[tuple[int, int], int]:
        """``below`` (the sub-tree's :attr:`Ack.predates`) with this node's own:
        per source stream, one past the newest publication received here, or
        skipped here (below this node's bound, or predating its subscription).

        Why the new subscriber needs it: one of this node's publications that
        predates the subscription is skipped there unseen, and its causal past
        (all received here before this node learnt of the subscription, this
        ACK is later) must be skipped too, or a copy of it arriving later (a
        crashed source's last round, relayed) would be delivered after what
        followed it.  A bound, where one comes, says more; it wins.  Every
        entry counts publications made before the subscription is confirmed,
        none of which is owed to it."""
        out = dict(below)
        for key, seq in state.last_rx.items():
            stream = _stream_of(key)
            out[stream] = max(out.get(stream, 0), seq + 1)
        if state.subscribed:
            for mine in (state.bounds, state.predates):
                for stream, first in mine.items():
                    if first < DEAD_BOUND:
                        out[stream] = max(out.get(stream, 0), first)
        for stream in [s for s in out if s in bounds or s[0] == self.id]:
            del out[stream]
        return out

    def _on_ack(self, sender: int, packet: Ack) -> list[Output]:
        # A round id hashes in Python (a dataclass): skip the look-up while no
        # repair copy is out, which is every ACK of a crash-free run.
        rid = self._repair_of.get(packet.round, packet.round) if self._repair_of else packet.round
        pending = self._pending.get(rid)
        if self._stale_ack(sender, rid, pending, repair=rid != packet.round):
            return []
        if pending is None or pending.topic != packet.topic or sender not in pending.waiting:
            raise RemoteProtocolError(f"unexpected ACK from {sender} for {packet.round!r}")
        if rid != packet.round:
            del self._repair_of[packet.round]
        limit = self.config.max_view_entries
        if (
            len(packet.view) > limit
            or max(len(packet.bounds), len(packet.predates), len(packet.beyond)) > limit
        ):
            raise RemoteProtocolError(f"ACK from {sender} carries more than {limit} entries")
        if pending.view is not None:
            for entry in packet.view:
                if entry.newer_than(pending.view.get(entry.node)):
                    pending.view[entry.node] = entry
        if pending.bounds is not None:
            _merge_max(pending.bounds, _bounds_of(packet.bounds))
        if pending.predates is not None and packet.predates:
            _merge_max(pending.predates, _bounds_of(packet.predates))
        if pending.beyond is not None and packet.beyond:
            _merge_max(pending.beyond, _bounds_of(packet.beyond))
        pending.waiting.discard(sender)
        if pending.waiting:
            return []
        return self._finish(rid, pending)

    def _stale_ack(
        self, sender: int, rid: RoundId, pending: _Pending | None, *, repair: bool
    ) -> bool:
        """An honest ACK that no longer matters: one of the original round from a
        child repaired away (it was wrongly taken for crashed), or for a round
        of a repair copy itself repaired away (:meth:`_repair_child` retires
        it), or any ACK with no round here at a restarted node.  A live repair
        round's ACK counts even from the same id (a newer incarnation of the
        crashed child)."""
        if pending is not None:
            return not repair and pending.replaced is not None and sender in pending.replaced
        # A restarted node may get ACKs its previous incarnation was owed (the
        # sender has not heard of the restart): no id on an ACK tells them
        # from garbage, and dropping one changes nothing here.
        return rid in self._stale or self.incarnation > 0

    def _finish(self, rid: RoundId, pending: _Pending) -> list[Output]:
        """Every child acknowledged ``rid``: acknowledge upwards, or end the source's round."""
        del self._pending[rid]
        if pending.replaced is not None:
            self._retire(rid)
        if pending.parent is not None:
            return [self._ack_for(rid, pending)]
        return self._round_done(rid, pending)

    # ----------------------------------------------------------- source rounds

    def _enqueue(self, state: _Topic, op: QueueItem) -> list[Output]:
        """Queue ``op``; start it now if no round of this topic is in flight."""
        state.queue.append(op)
        return self._start_round(state) if state.in_flight is None else []

    def _start_round(self, state: _Topic) -> list[Output]:
        """Start the next round from the queue; loops while rounds complete at once.

        Invariant: at most one round per topic is in flight from this source,
        so rounds (and so receptions from this source) are totally ordered.
        """
        out: list[Output] = []
        while state.queue and state.in_flight is None:
            rid, sends, pending = self._launch(state, state.queue.popleft())
            out.extend(sends)
            if rid is None:
                out.extend(self._complete(state, pending))
            else:
                state.in_flight = rid
        return out

    def _launch(
        self, state: _Topic, head: QueueItem
    ) -> tuple[RoundId | None, list[Output], _Pending]:
        """Number a round of this node starting with ``head`` and send it: its
        id (``None`` if it reached nobody, so nothing awaits its ACKs), its
        sends, and its pending record (tracked while ACKs are awaited)."""
        rid = RoundId(self.id, self.incarnation, self._rounds)
        self._rounds += 1
        children, pending = self._round_for(state, rid, head)
        if not children:
            return None, [], pending
        self._track(rid, pending, children)
        return rid, [Send(c, p) for c, p in children], pending

    def _round_for(
        self, state: _Topic, rid: RoundId, head: QueueItem
    ) -> tuple[list[tuple[int, Packet]], _Pending]:
        """The packets of round ``rid`` starting with ``head``, and its pending record."""
        name = state.name
        if isinstance(head, ViewEntry) and head.subscribed:
            kids = self.overlay.children_at(self.id, ID_BITS)
            state.lonely = not kids
            sub = Sub(rid, name, head)
            pend = _Pending(name, "SUB", None, set(kids), (head.op_id,))
            return [(k, sub) for k in kids], pend
        subs = state.subscribers()
        dests = partition_sorted(self.id, subs)
        kind: str
        ids: tuple[MsgId, ...]
        if isinstance(head, _Announce):
            own = state.view.get(self.id)
            if own is None:
                return [], _Pending(name, "SYNC", None, set())
            pend = _Pending(name, "SYNC", None, set(), (own.op_id,))
            pend.dest = head.dest
            if self._known_dead(head.dest):
                return [], pend  # completes at once: nobody to wait for
            pend.waiting.add(head.dest)
            known = state.view.get(head.dest)
            frontier: tuple[dict[tuple[int, int], int], ...] = ({}, {})
            if known is None or known.incarnation < self._life.get(head.dest, 0):
                frontier = self._sync_frontier(state, head.dest)  # the op is unknown here
            first, beyond = (_as_bounds(f) for f in frontier)
            return [(head.dest, Uns(rid, name, own, (), first, beyond))], pend
        children: list[tuple[int, Packet]]
        if isinstance(head, ViewEntry):
            children = [(c, Uns(rid, name, head, share)) for c, share in dests]
            kind, ids = "UNS", (head.op_id,)
        elif isinstance(head, _Relay):
            batch = head.messages
            if head.dest is not None:  # one newcomer's copy: no route below it
                dests = [] if self._known_dead(head.dest) else [(head.dest, ())]
            else:  # a crash relay names dead rounds as a round does
                self._dead_rounds_ahead(state, batch)
            children = [(c, PubRound(rid, name, batch, share)) for c, share in dests]
            kind, ids = "RELAY", tuple(m.id for m in batch)
        else:
            batch = self._take_batch(state, head)
            children = [(c, PubRound(rid, name, batch, share)) for c, share in dests]
            kind, ids = "PUB", tuple(m.id for m in batch)
            state.freeze_round_view()
            self._dead_rounds_ahead(state, batch)
        waiting = {c for c, _ in children}
        return children, _Pending(name, kind, None, waiting, ids)

    def _dead_rounds_ahead(self, state: _Topic, batch: tuple[PubMessage, ...]) -> None:
        """Queue next one-destination relays of the crashed sources'
        last rounds ``batch`` names directly, to the subscribers of this
        round whose subscription the crash relay did not reach (they came
        after it).  Such a subscriber would hold the publication naming one
        for good: the source died before it subscribed, no member's frontier
        need cover it, and a frontier that did would not say whether it is
        owed (found: the CI profile's seed 89308, where node 4 held node 0's
        (0, 5), which names dead node 2's (2, 6), for good).  What of it is
        not owed there is skipped there, or settled (:meth:`_follows_op`).
        Each goes once per subscription (``_DeadRound.reached``)."""
        if not state.dead_rounds:
            return
        named = {d for m in batch for d in m.deps}
        view, relays = state.view, []
        for dead in state.dead_rounds.values():
            if dead.ids.isdisjoint(named):
                continue
            for node in state.subscribers():
                if node != self.id and dead.reach((node, view[node].incarnation)):
                    relays.append(_Relay(dead.messages, node))
        state.queue.extendleft(reversed(relays))

    def _dead_rounds_to(self, state: _Topic, entry: ViewEntry) -> list[Output]:
        """Relay, at once, the crashed sources' last rounds this node relayed at
        the crash to the subscription ``entry``, learnt in an announce
        exchange, unless known to have them (``_DeadRound.reached``).  One it
        did not relay was not owed here, maybe nowhere: passed on, it would
        be delivered where nobody else has it (``bench.failure_fuzz`` seed
        3234 with ``--tpp-stdev 60``).

        Such a subscription came after the crash relay, and its SUB round did
        not reach this node (or it would have its ``DEAD_BOUND``s), so it may
        hold, for good, a publication that names one of those rounds'
        stream only through others: a relay of the last round is what
        settles the stream there (:meth:`_start_stream_at`), and
        :meth:`_dead_rounds_ahead` sends one only to where a round names it
        directly (verify profile, seed 48833: a node back from a crash held,
        for good, a publication naming one that names a publication of a
        node dead before it came back; ``test_sim_detector.py``)."""
        if not state.dead_rounds or not entry.subscribed or entry.node == self.id:
            return []
        life = (entry.node, entry.incarnation)
        out: list[Output] = []
        for dead in list(state.dead_rounds.values()):
            if dead.relayed and dead.reach(life):
                out.extend(self._relay_now(state, _Relay(dead.messages, entry.node)))
        return out

    def _take_batch(self, state: _Topic, head: PubMessage) -> tuple[PubMessage, ...]:
        """``head`` and the publications queued right behind it, within the round limits
        (a :class:`~topics.Chain` if they are one: receivers check it once)."""
        batch = [head]
        size = len(head.payload)
        cfg, queue, append = self.config, state.queue, batch.append
        most, room = cfg.max_round_bytes, cfg.max_round_messages - 1
        while queue and room:
            nxt = queue[0]
            if type(nxt) is not PubMessage or size + len(nxt.payload) > most:
                break
            append(nxt)
            size += len(nxt.payload)
            queue.popleft()
            room -= 1
        return chain_of(batch)

    def _round_done(self, rid: RoundId, pending: _Pending) -> list[Output]:
        state = self._topics[pending.topic]
        if state.in_flight != rid:
            return self._complete(state, pending)  # a crash relay, sent beside it
        state.in_flight = None
        out = self._complete(state, pending)
        out.extend(self._start_round(state))
        return out

    def _relay_now(self, state: _Topic, relay: _Relay) -> list[Output]:
        """Start the crash relay ``relay`` at once, beside any round in flight.

        A crash relay is how the publications of a crashed source that some
        node holds reach every subscriber (agreement); queued behind this
        node's own round, it waited for that round's ACK wave, which can
        wait a whole detection delay on a child that crashed unseen, and
        died with this node if it crashed meanwhile (``bench.failure_fuzz``
        seed 4691 with ``--tpp-stdev 60``: the three holders of a dead
        source's last round all crashed with the relay queued).  It carries
        another source's stream, so the order of this node's own rounds,
        which per-source FIFO rests on, is not touched."""
        out = self._launch(state, relay)[1]
        if state.in_flight is None:  # what _round_for queued (dead rounds ahead)
            out.extend(self._start_round(state))
        return out

    def _complete(self, state: _Topic, pending: _Pending) -> list[Output]:
        """The ACK wave of one of this node's rounds came back (line 34)."""
        if pending.kind == "SYNC":
            return self._synced(state, pending)
        if pending.kind == "RELAY":
            return []
        out: list[Output] = [RoundAcked(state.name, pending.kind, pending.ids)]
        if pending.kind != "SUB":
            return out
        assert pending.view is not None
        assert pending.bounds is not None
        for entry in pending.view.values():
            out.extend(self._learn(state, entry))
        own = state.view.get(self.id)
        if state.subscribed and own is not None and own.op_id == pending.ids[0]:
            _merge_max(state.bounds, pending.bounds.items())
            _merge_max(state.predates, (pending.predates or {}).items())
            state.syncing = self._unreached(state)
            if not state.syncing:
                out.extend(self._open(state))
            for node in sorted(state.syncing, reverse=True):
                state.queue.appendleft(_Announce(node))  # next, before any later op
        return out

    def _unreached(self, state: _Topic) -> set[int]:
        """Subscribers this SUB round did not reach: every node it reached gave
        a bound, so these are up as an incarnation this node took for dead (or
        did not know) when the round started.  They could publish without ever
        sending here: each gets an announce, and confirmation waits for it."""
        return {
            n for n, e in state.view.items()
            if e.subscribed and n != self.id and (n, e.incarnation) not in state.bounds
            and not self._is_dead(n, e.incarnation)
        }  # fmt: skip

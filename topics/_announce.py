"""Announces to newcomers, and the frontiers they carry.

A node that joins (or comes back) missed the SUB rounds flooded meanwhile:
each subscriber tells it its own subscription in a one-destination round,
acknowledged (as a SYNC) with the newcomer's entry, its bound and, where the
announce taught it the op, its frontier.  The marks kept per stream in
``_Topic.novel`` (:meth:`_Announcing._note_novel`) are what a frontier stops
at.  Invariant: a frontier covers no publication owed to the subscription
it is given to (argued at :meth:`_Announcing._sync_frontier`), and only a
subscription confirmed knowing nobody takes one
(:meth:`_Announcing._frontier`).
"""

from __future__ import annotations

from itertools import pairwise

from causal import MsgId
from topics._aggregation import _Aggregation
from topics._chain import Chain
from topics._events import Output, Send
from topics._messages import Ack, Bound, PubMessage, RoundId, ViewEntry
from topics._state import (
    ANY_OP,
    GAP,
    GAP2,
    GAP_FROM,
    StreamKey,
    _as_bounds,
    _held_below,
    _held_through,
    _kept_items,
    _merge_max,
    _Pending,
    _stream_key,
    _stream_of,
    _Topic,
)


class _Announcing(_Aggregation):
    """Announces, bounds for announcers and frontiers (see the module docstring)."""

    # Defined by _Rounds (topics._rounds), which builds on this class; a real
    # method, as there, since mypyc's build takes no TYPE_CHECKING stubs.
    def _dead_rounds_to(self, state: _Topic, entry: ViewEntry) -> list[Output]:
        raise NotImplementedError

    def _took(self, state: _Topic, fresh: tuple[PubMessage, ...]) -> None:
        """Mark ``fresh`` (one stream, in order, new here; before ``last_rx``
        records them) on a topic not started by an oracle (the callers check
        ``preset``, so a preset run's hot path makes no call):
        :meth:`_note_novel`, and the stream's first reception."""
        self._note_novel(state, fresh)
        first = fresh[0].id
        state.first_rx.setdefault(_stream_key(first.source, first.incarnation), first.seq)

    def _note_novel(self, state: _Topic, fresh: tuple[PubMessage, ...]) -> None:
        """Mark, per node, the first of ``fresh`` (one stream, in order) that may
        follow an op of that node this node does not know: it names one, or
        follows one marked for that node (so marks follow causal chains), or a
        publication of another stream that never came here (then for any node,
        ``ANY_OP``).  The first whose own predecessor never came here is marked
        ``GAP``, the second ``GAP2``; where the first gap may start is kept as
        ``GAP_FROM`` (:meth:`_unknown_ops` marks what names a publication from
        there on)."""
        src, inc = fresh[0].id.source, fresh[0].id.incarnation
        key = _stream_key(src, inc)
        marks = state.novel.get(key)
        if marks is not None and ANY_OP in marks:
            return  # everything from there on is marked already
        last = state.last_rx.get(key, -1)
        # Of a chain, each after the first names only the one before it, which
        # the loop leaves as ``last``: all of them take its first branch.
        for msg in fresh[:1] if type(fresh) is Chain else fresh:
            deps = msg.deps
            if (
                not msg.op_deps
                and len(deps) == 1
                and deps[0][0] == src
                and deps[0][1] == inc
                and msg.prev <= last
            ):
                last = msg.id.seq  # names only its own stream: _unknown_ops finds nothing
                continue
            found = self._unknown_ops(state, msg)
            if msg.prev > last:
                if not marks or GAP not in marks:
                    # What names a publication in the gap follows an unknown
                    # past (failure_fuzz partial seed 1102671).
                    marks = state.novel.setdefault(key, {})
                    marks[GAP_FROM] = last + 1
                found.add(GAP2 if GAP in marks else GAP)
            if found:
                marks = self._mark(state, key, found, msg.id.seq)
                if ANY_OP in found:
                    return
            last = msg.id.seq

    def _note_own(self, state: _Topic, msg: PubMessage) -> None:
        """:meth:`_note_novel` for this node's own publication ``msg``: it follows
        what the publications it names were marked for, so a publication of
        another source that names it is marked through it."""
        found = self._unknown_ops(state, msg)
        if found:
            self._mark(state, _stream_key(self.id, self.incarnation), found, msg.id.seq)

    @staticmethod
    def _mark(state: _Topic, key: StreamKey, found: set[int], seq: int) -> dict[int, int]:
        """Mark ``seq`` of stream ``key`` for each of ``found`` not marked there
        before (a stream's first mark per node is the one a frontier stops at)."""
        marks = state.novel.setdefault(key, {})
        for node in found:
            marks.setdefault(node, seq)
        return marks

    def _unknown_ops(self, state: _Topic, msg: PubMessage) -> set[int]:
        """The nodes of ops ``msg`` may follow that this node does not know
        (``ANY_OP``: a publication of another stream it names never came here,
        or came after a gap there; this node's own count as come, and
        :meth:`_note_own` marks them).  Its own stream is left to the marks
        there (:meth:`_note_novel`)."""
        src, inc = msg.id.source, msg.id.incarnation
        found: set[int] = set()
        view, me, life = state.view, self.id, self.incarnation
        for o in msg.op_deps:
            e = view.get(o.source)
            if (e is None or (e.incarnation, e.rc) < (o.incarnation, o.seq)) and o.source != me:
                found.add(o.source)
        last_rx, novel = state.last_rx, state.novel
        for d in msg.deps:
            if d.source == src and d.incarnation == inc:
                continue  # its own stream: the marks there stop a frontier already
            k = _stream_key(d.source, d.incarnation)
            if d.seq > last_rx.get(k, -1) and (d.source != me or d.incarnation != life):
                return {ANY_OP}
            marks = novel.get(k) if novel else None
            if marks:
                for n, first in marks.items():
                    if d.seq >= first:
                        found.add(n if n >= 0 else ANY_OP)  # a gap there: any op
        return found

    def _sync_frontier(
        self, state: _Topic, newcomer: int
    ) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
        """What an announce to or from ``newcomer``, or its ACK, tells it: per
        stream, one past the newest publication received here, stopped at the
        first that may follow an op of ``newcomer`` this node did not know when
        it came (:meth:`_note_novel`).

        Invariant (why none of it is owed to the newcomer): it is taken while
        this node does not know the newcomer's op (an ACK only if the
        announce taught it; an announce only if this node holds no entry of
        the newcomer's life).  A publication owed there was made by a source
        that knew the op, so it follows, through a chain of direct
        predecessors, one that names the op; at each link this node either
        lacked the predecessor or marked it, so the mark stops the frontier
        before it; a link of the source's own stream that never came here
        stops it too (a gap, ``GAP``).  This node's own publications and
        skipped ones are left out (its bound says more; what it skipped is not
        known here).

        Returns that frontier and ``beyond``: for the streams where a gap
        stopped it, where it would stop without that gap (at the next gap at
        most).  The gap cannot hold the first publication its source made
        after it learnt the op: that one went to the newcomer in a round that
        completed before the round of the publication after the gap (received
        here) started.  So if the newcomer received nothing of the stream
        below the frontier (the publication after the gap), nothing in the
        gap follows the op (:meth:`_frontier`)."""
        first: dict[tuple[int, int], int] = {}
        beyond: dict[tuple[int, int], int] = {}
        if state.preset:
            return first, beyond  # no marks kept: nothing provably not owed
        novel = state.novel
        for key, seq in state.last_rx.items():
            stream = _stream_of(key)
            if stream[0] == self.id:
                continue
            end = seq + 1
            marks = novel.get(key)
            if marks:
                end = min(end, marks.get(newcomer, end), marks.get(ANY_OP, end))
            gap = marks.get(GAP) if marks else None
            if marks and gap is not None and gap < end:
                beyond[stream] = min(end, marks.get(GAP2, end))  # past one gap only
                end = gap
            if end > 0:
                first[stream] = end
        return first, beyond

    def _sync_ack(self, rid: RoundId, pending: _Pending) -> Send:
        """ACK an announce with this node's entry and, if it published, its bound
        for the announcer (:meth:`_sync_bound`), as a SUB round's ACK would have;
        and this node's frontier if the announce taught it the op."""
        assert pending.parent is not None
        state = self._topic(pending.topic)
        bounds: tuple[Bound, ...] = ()
        if state.published:
            bound = self._sync_bound(state, pending.ids[0])
            bounds = (Bound(self.id, self.incarnation, bound),)
        # This node's own entry too: an UNS of it that started before it
        # learned of the announcer went elsewhere, and the announcer may know
        # the subscription it ends (from another node's view).
        own = state.view.get(self.id)
        view = (own,) if own else ()
        frontier: tuple[dict[tuple[int, int], int], ...] = ({}, {})
        if pending.predates is not None:  # this announce taught the op
            frontier = self._sync_frontier(state, pending.ids[0].source)
        return Send(
            pending.parent,
            Ack(
                rid,
                pending.topic,
                view,
                bounds,
                _as_bounds(frontier[0]),
                _as_bounds(frontier[1]),
            ),
        )

    def _sync_bound(self, state: _Topic, announced: MsgId) -> int:
        """The first of this node's publications not known to have reached the
        ``announced`` subscription already, all of which will: the PUB round in
        flight if it went to that very op, else the first one still queued (its
        round will go there: the announce is in the view now), else the next
        one.  Everything older was in a completed round, so if it went there it
        is there.  A round in flight to an older op of the announcer (an older
        life, or a subscription it has left since) may arrive before the
        announced one started: not owed, so not in the bound."""
        pending = self._pending.get(state.in_flight) if state.in_flight else None
        reached = state.round_reached(announced)
        if pending is not None and pending.kind == "PUB" and reached:
            return pending.ids[0].seq
        for item in state.queue:
            if isinstance(item, PubMessage):
                return item.id.seq
        return self._counter

    def _synced(self, state: _Topic, pending: _Pending) -> list[Output]:
        """The newcomer acknowledged this node's announce with its own entry
        (learned here) and ``b``, the first of its publications not known to
        have reached this node already, all of which will (:meth:`_sync_bound`).

        Used only for a stream with no bound yet (a SUB round's ACK said more).
        Everything from ``b`` on comes here.  Before ``b``, the newcomer may
        still have sent publications here under an older entry of this node in
        its view: the oldest one held starts the stream instead
        (:meth:`_start_stream_at`).  Older ones are not owed.
        """
        out: list[Output] = []
        for entry in (pending.view or {}).values():
            out.extend(self._learn(state, entry))
            out.extend(self._dead_rounds_to(state, entry))
        own = state.view.get(self.id)
        if own is None or not own.subscribed or pending.ids != (own.op_id,):
            return out  # announced an older op: the bound says nothing of this one
        if pending.predates and state.lonely:  # also while confirmation waits for it
            out.extend(self._frontier(state, pending.predates, pending.beyond or {}))
        if not state.confirmed:
            if pending.dest not in state.syncing:
                return out  # the SUB round of this op is still to come
            return out + self._sync_before_confirm(state, pending)
        if not pending.bounds:
            return out
        ready: list[PubMessage] = []
        for (node, inc), first in pending.bounds.items():
            if (node, inc) in state.bounds:
                continue
            settled = state.buffer.frontier(node, inc)
            if settled is not None and settled >= first:
                # A predates cut settled the stream past the bound already (a
                # lonely frontier, _frontier), and what names the skipped ones
                # may be delivered: they stay skipped, or one coming now would
                # follow its successors (failure_fuzz partial seed 401393).
                first = max(first, state.predates.get((node, inc), 0))
            held = _held_below(state, node, inc, first)
            if held and _held_through(held, first):
                ready.extend(self._start_stream_at(state, held[0]))
            else:
                state.bounds[(node, inc)] = first
                ready.extend(self._bridge_held(state, node, inc, first, held))
        out.extend(self._release(state, ready))
        out.extend(self._unblock_predating(state))
        return out

    @staticmethod
    def _bridge_held(
        state: _Topic, node: int, inc: int, first: int, held: list[PubMessage]
    ) -> list[PubMessage]:
        """Settle stream ``(node, inc)`` below an announce bound ``first`` that its
        ``held`` publications (:func:`_held_below`) do not reach in one run
        (:func:`_held_through`): what
        is missing between them never comes, yet what is held goes in FIFO
        order.  The frontier moves to just below the oldest held one, and past
        each gap only once the publication before the gap is settled here
        (``state.bridges``, followed by :meth:`_release`).

        Moving it to ``first - 1`` at once let a held publication go before an
        older one still waiting on another predecessor (a FIFO violation,
        ``test_core.py``'s announce-bound case): sequence numbers are not
        contiguous, since ops and other topics share the counter, so a run
        with no gap at all was taken for one with gaps."""
        if not held:
            return state.buffer.advance(node, inc, first - 1)
        ahead: dict[int, int] = {}
        for before, after in pairwise(held):
            if after.prev != before.id.seq:
                ahead[before.id.seq] = after.prev
        if held[-1].id.seq < first - 1:
            ahead[held[-1].id.seq] = first - 1
        if ahead:
            state.bridges.setdefault(_stream_key(node, inc), {}).update(ahead)
        return state.buffer.advance(node, inc, held[0].prev)

    def _frontier(
        self,
        state: _Topic,
        predates: dict[tuple[int, int], int],
        beyond: dict[tuple[int, int], int],
    ) -> list[Output]:
        """A member's frontier (:meth:`_sync_frontier`), from the ACK of this
        node's announce or from an announce it sent here: skipped where no
        bound came, as a SUB round's ``predates``.

        What makes a subscription confirmed knowing nobody (its SUB round
        reached nobody) live: a publication owed here that names a publication
        of a source that died unseen (which never comes) no longer waits.
        Only such a subscription takes frontiers (``lonely``): it exists only
        where membership is partial, and there a publication is owed only to
        the subscribers its source knew, which it then names in its barrier;
        with full membership a publication made before its source's own SUB
        round ended names nobody yet is owed to every subscriber confirmed
        before it (found: ``tests/test_checkcli.py``'s eighty scenarios, seed
        74), and frontiers are not needed there.

        The cut stops below a publication held here (or received before the
        confirmation): the member's frontier covers the gaps in its own
        reception, where an owed publication can be (found: the verify
        profile's seed 0 with ten nodes, where the held (8, 1) was dropped as
        skipped and never delivered).  One that is not owed cannot break
        causal order by waiting: the skips past the same cut turn this
        subscription blind (:meth:`_follows_op`), and it is settled
        undelivered (it used to be dropped for that: a held relay of a dead
        source's last round was delivered after a publication that follows
        it).  Where
        the member's frontier stopped at a gap, ``beyond`` is taken instead if
        this node received nothing of the stream below it (see
        :meth:`_sync_frontier`)."""
        if beyond:
            predates = dict(predates)
            for stream, end in beyond.items():
                got = state.first_rx.get(_stream_key(*stream))
                if got is None or got >= predates.get(stream, end):
                    predates[stream] = max(end, predates.get(stream, 0))
        bounds, inferred = state.bounds, state.inferred
        taken = self._oldest_taken(state)
        cut: dict[tuple[int, int], int] = {}
        for stream, end in predates.items():
            first = min(end, taken.get(stream, end))
            if (stream not in bounds or stream in inferred) and first > bounds.get(
                stream, state.predates.get(stream, 0)
            ):
                cut[stream] = first
        if not cut:
            return []
        for stream, first in cut.items():
            if stream in bounds:
                bounds[stream] = first  # it stood in for a bound: the frontier says more
            else:
                state.predates[stream] = first
        ready: list[PubMessage] = []
        for (node, inc), first in cut.items():
            ready.extend(state.buffer.advance(node, inc, first - 1))
        return self._release(state, ready) + self._unblock_predating(state)

    @staticmethod
    def _oldest_taken(state: _Topic) -> dict[tuple[int, int], int]:
        """Per stream, the oldest publication held here, or received before
        the subscription was confirmed: where a frontier's cut stops
        (:meth:`_frontier`)."""
        found: dict[tuple[int, int], int] = {}
        for msg in [*_kept_items(state), *state.early]:
            stream = (msg.id.source, msg.id.incarnation)
            found[stream] = min(found.get(stream, msg.id.seq), msg.id.seq)
        return found

    def _sync_before_confirm(self, state: _Topic, pending: _Pending) -> list[Output]:
        """An announce sent for :meth:`_unreached` came back: its bound counts as a
        SUB round's would; the last one confirms the subscription."""
        _merge_max(state.bounds, (pending.bounds or {}).items())
        state.syncing.discard(pending.dest)
        return [] if state.syncing else self._open(state)

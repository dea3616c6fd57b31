"""Causal delivery of one subscription: deliver, hold back or skip.

A received publication is delivered once everything it depends on that can
still come (:meth:`_Delivery._live_deps`) has been delivered or skipped;
one that predates the subscription (:meth:`_Delivery._skipped`) is skipped:
never delivered, never waited for.  Invariants: nothing is delivered before
the subscription is confirmed (:meth:`_Delivery._open`; until then
receptions wait in ``early``); delivery follows causal order, and what a
skipped publication waited for is waited for by what depends on it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from causal import Dep, MsgId, op_stream
from topics._base import _CoreBase
from topics._events import Delivered, Output, Received, Subscribed
from topics._messages import PubMessage, ViewEntry
from topics._state import (
    DEAD_BOUND,
    SKIPPED_PAST,
    _kept_items,
    _oldest_held,
    _stream_key,
    _Topic,
)


def _deps(msg: PubMessage) -> list[Dep]:
    """What ``msg`` waits for: its barrier, its ops, and the source's previous publication.

    A publication id is its own dependency triple (no allocation); the source's
    previous publication is always in the causal past but may have left the
    barrier, so it is named too to keep per-source FIFO explicit.
    """
    deps: list[Dep] = list(msg.deps)
    if msg.op_deps:
        deps.extend((op_stream(o.source), o.incarnation, o.seq) for o in msg.op_deps)
    if msg.prev >= 0:
        deps.append((msg.id.source, msg.id.incarnation, msg.prev))
    return deps


def _held_before(state: _Topic, msg: PubMessage, lost: Iterable[Dep]) -> list[MsgId]:
    """The publications held here that may precede the publications ``lost``
    (ones ``msg`` names that will never be delivered here, whose causal past
    is unknown here): all but those that follow ``msg`` or one of ``lost``
    through what is held (naming it, a later one of its stream, one that
    does, or one held behind such a wait that waits for one of those), and
    those already held behind such a wait (``state.fence_held``).  Invariant:
    no circle of waits.  A held publication that waits, even only behind such
    a wait, for what follows ``msg`` would wait for ``msg`` in turn; waiting
    on it too closed a circle and held all of them for good (verify profile:
    ``test_sim_detector.py``'s one-way property, seed 262144)."""
    kept = {h.id for h in state.buffer.items()}
    for mid in [m for m in state.fence_held if m not in kept]:
        del state.fence_held[mid]
    held = _kept_items(state)  # what the fence keeps is held too
    after = {(msg.id.source, msg.id.incarnation): msg.id.seq}
    for src, inc, seq in lost:
        after[(src, inc)] = min(seq, after.get((src, inc), seq))
    behind = state.fence_held
    follows = _follows_through(held, after, {k: v[1] for k, v in behind.items()})
    return [h.id for h in held if not follows(*h.id) and h.id not in behind]


def _following(held: Iterable[PubMessage], msg: PubMessage, among: Iterable[Dep]) -> set[Dep]:
    """Those of ``among`` that follow ``msg`` through what is held: a later
    publication of its stream, or one whose own predecessors (:func:`_deps`,
    never an extra wait) lead there."""
    follows = _follows_through(held, {(msg.id.source, msg.id.incarnation): msg.id.seq}, {})
    return {d for d in among if follows(*d)}


def _follows_through(
    held: Iterable[PubMessage],
    after: dict[tuple[int, int], int],
    extra: dict[MsgId, tuple[Dep, ...]],
) -> Callable[[int, int, int], bool]:
    """Whether a publication follows, through ``held``, one of those ``after``
    names (per stream, the first that follows): ``after`` grows to every held
    publication whose predecessors (:func:`_deps`), or its ``extra`` waits,
    include one that follows, and a later one of a following stream follows."""

    def follows(src: int, inc: int, seq: int) -> bool:
        return after.get((src, inc), seq + 1) <= seq

    held = list(held)
    grown = True
    while grown:
        grown = False
        for h in held:
            src, inc, seq = h.id
            if follows(src, inc, seq):
                continue
            if any(follows(*d) for d in _deps(h)) or any(follows(*d) for d in extra.get(h.id, ())):
                after[(src, inc)] = seq
                grown = True
    return follows


def _predates(state: _Topic, src: int, inc: int, seq: int) -> bool:
    """Whether publication ``(src, inc, seq)`` predates ``state``'s subscription
    (a bound, a ``predates`` without a bound, or a retired stream)."""
    bound = state.bounds.get((src, inc)) if state.bounds else None
    if bound is not None:
        return seq < bound
    if state.predates and seq < state.predates.get((src, inc), 0):
        return True
    return inc <= state.retired.get(src, -1)


def _cross(state: _Topic, mid: MsgId) -> list[PubMessage]:
    """``mid`` is settled here: if a gap of its stream follows it (a bridge of
    :meth:`VCubePS._bridge_held`), move the stream's frontier past the gap and
    return what that releases."""
    key = _stream_key(mid.source, mid.incarnation)
    ahead = state.bridges.get(key)
    to = ahead.pop(mid.seq, None) if ahead else None
    if to is None:
        return []
    if not ahead:
        del state.bridges[key]
    return state.buffer.advance(mid.source, mid.incarnation, to)


def _note_seen(state: _Topic, msg: PubMessage) -> None:
    """``msg`` came to ``state``'s subscription: keep ``state.seen`` the oldest of its stream."""
    key = _stream_key(msg.id.source, msg.id.incarnation)
    first = state.seen.get(key)
    if first is None or msg.id.seq < first:
        state.seen[key] = msg.id.seq


class _Delivery(_CoreBase):
    """Causal delivery on a node (see the module docstring)."""

    # Defined by _Receive (topics._receive), which builds on this class; a real
    # method, not a TYPE_CHECKING stub, which mypyc's build does not accept.
    def _ask_bounds(
        self, state: _Topic, firsts: tuple[PubMessage, ...], msgs: tuple[PubMessage, ...]
    ) -> list[Output]:
        raise NotImplementedError

    def _open(self, state: _Topic) -> list[Output]:
        """The subscription is confirmed: deliveries may start (Subscribed)."""
        state.confirmed = True
        return [Subscribed(state.name), *self._confirm(state)]

    def _retired_at_confirm(self, state: _Topic) -> dict[int, int]:
        """Per node, the newest incarnation whose streams predate this subscription."""
        retired = {n: i for n, i in self._dead.items() if (n, i) not in state.bounds}
        newest = dict(self._life)
        for node, inc in state.bounds:
            newest[node] = max(newest.get(node, 0), inc)
        for node, inc in newest.items():
            if inc > 0 and node != self.id:
                retired[node] = max(retired.get(node, -1), inc - 1)
        return retired

    def _confirm(self, state: _Topic) -> list[Output]:
        """Open delivery: every bound and learned op is now known (Subscribed).

        A source that crashed without giving a bound never learned of this
        subscription (or its ACK died with it, before the subscription was
        confirmed): none of its publications is post-subscription here, so
        its streams are retired rather than waited for.  So are incarnations
        older than one known to be up (in the view, or a bound): they crashed
        before this confirmation.  A bound, if one came, still wins.
        """
        out: list[Output] = []
        state.retired = self._retired_at_confirm(state)
        state.lossy_bounds = DEAD_BOUND in state.bounds.values()
        for (node, inc), first in state.bounds.items():
            out.extend(self._release(state, state.buffer.advance(node, inc, first - 1)))
        for (node, inc), first in state.predates.items():
            if (node, inc) not in state.bounds:
                out.extend(self._release(state, state.buffer.advance(node, inc, first - 1)))
        for entry in state.view.values():
            out.extend(self._op_learned(state, entry))
        early, state.early = state.early, []
        if state.lonely:  # all of them came: none is an unseen skip (_unseen_skip)
            for msg in early:
                _note_seen(state, msg)
        for msg in early:  # first, so that what depends on them, in any order, waits
            if self._skipped(state, msg):
                self._remember_skipped(state, msg)
        for msg in early:
            out.extend(self._consider(state, msg))
        if early:  # what came early was never asked about (found: verify, seed 20)
            came = tuple(early)
            out.extend(self._ask_bounds(state, came, came))
        return out

    def _on_publication(self, state: _Topic, msg: PubMessage) -> list[Output]:
        out: list[Output] = [Received(state.name, msg.id, relay=not state.subscribed)]
        if msg.op_deps:
            out.extend(self._learn_named(state, msg))
        if not state.subscribed or msg.id.source == self.id:
            return out
        if not state.confirmed:
            state.early.append(msg)
            self._note_held()
            return out
        out.extend(self._consider(state, msg))
        return out

    def _learn_named(self, state: _Topic, msg: PubMessage) -> list[Output]:
        """Learn the ops ``msg`` names that this node did not know (:meth:`_learn`).

        An op's own round reaches the subscribers its node knew at the time;
        a node that joined later, or that its node never knew, hears of it
        only through publications that name it.  Waiting for it then waited
        for good (verify profile: seed 1 with eight nodes, after a
        recovery, and seed 5369876 with ten sparse ids, no crash at all).
        The source knew the op when it published, so it is as true here as
        in the source's view, and this node's trees and barrier take it
        before anything that follows it is delivered.
        """
        out: list[Output] = []
        me = self.id
        for entry in msg.named_ops():
            if entry.node != me:
                out.extend(self._learn(state, entry))
        return out

    def _would_hold(self, topic: str, messages: tuple[PubMessage, ...]) -> int:
        """How many of a round's publications would be held back if received now.

        Exact for the buffer as it stands (releases could only lower it), so a
        full buffer still admits the predecessors that drain it: the bound on
        held publications never blocks honest traffic.
        """
        state = self._topics.get(topic)
        if state is None or not state.subscribed:
            return 0
        if not state.confirmed:
            return len(messages)
        arriving: set[Dep] = set()
        held = 0
        for msg in messages:
            if msg.id.source == self.id:
                continue
            ready = self._skipped(state, msg) or all(
                d in arriving or state.buffer.satisfied(d) for d in self._live_deps(state, msg)
            )
            if ready:
                arriving.add((msg.id.source, msg.id.incarnation, msg.id.seq))
            else:
                held += 1
        return held

    def _consider(self, state: _Topic, msg: PubMessage) -> list[Output]:
        """Deliver ``msg`` now, hold it back, or skip it as older than the subscription."""
        if state.lonely:
            _note_seen(state, msg)
        if self._skipped(state, msg):
            self._remember_skipped(state, msg)
            return []  # not post-subscription: never delivered here, never waited for
        out: list[Output] = []
        src, inc = msg.id.source, msg.id.incarnation
        if msg.prev >= 0 and self._is_dead(src, inc) and (src, inc) not in state.bounds:
            out.extend(self._release(state, self._start_stream_at(state, msg)))
        deps = self._live_deps(state, msg)
        behind: list[Dep] | None = None  # no list per delivery
        if state.retired or state.predates or state.fences or state.lossy_bounds:
            behind = self._behind_lost(state, msg)
            if behind is None:  # it waits for a decision or marks first (topics._fence)
                return out + self._await_marks(state, msg)
        own = deps
        if behind:
            deps = [*deps, *behind]
        if state.buffer.add(msg, deps):
            out.extend(self._release(state, [msg]))
        else:
            if behind:
                state.fence_held[msg.id] = (tuple(own), tuple(behind))
            self._note_held()
            if state.fence_held:
                out.extend(self._void_waits(state))
        return out

    def _void_waits(self, state: _Topic) -> list[Output]:
        """Drop each extra wait of ``state.fence_held`` whose publication is now
        seen to follow its holder through the predecessors of what is held
        here: it cannot precede the holder, so the wait was needless, and it
        closed a circle once that publication waited for the holder in turn
        (verify profile: ``test_sim_detector.py``'s one-way property, seed
        262144: node 213 held (126, 1) behind a wait for (659150, 1), which
        names (1952985, 1), which names (126, 1) and came last).  Invariant: a
        wait is dropped only where the publication it waits for follows the
        holder through the publications' own predecessors."""
        held = {m.id: m for m in state.buffer.items()}
        out: list[Output] = []
        for mid, (own, extra) in list(state.fence_held.items()):
            msg = held.get(mid)
            if msg is None:
                continue
            void = _following(held.values(), msg, extra)
            if not void or not state.buffer.withdraw(msg):
                continue
            keep = tuple(d for d in extra if d not in void)
            if keep:
                state.fence_held[mid] = (own, keep)
            else:
                del state.fence_held[mid]
            if state.buffer.add(msg, [*own, *keep]):
                out.extend(self._release(state, [msg]))
        return out

    def _behind_lost(self, state: _Topic, msg: PubMessage) -> list[Dep] | None:
        """What ``msg`` waits for beyond its barrier: a publication it names
        that will never be delivered here (of a stream retired at the
        confirmation, or given up by a fence) took its causal past with it,
        part of which may be held here and owed; ``msg`` waits for every held
        publication that may be in it (:func:`_held_before`).  Without it a
        subscription confirmed after a source's crash delivered (7, 2), which
        names that source's (6, 2), before (2, 2) and (1, 1), which (6, 2)
        follows (``bench.failure_fuzz`` recover seed 81681, ``--tpp-stdev 60``;
        it failed on 1fb4b73 too).  A publication seen here and skipped
        brings its own past in instead (``skipped_past``).  ``None``: that
        past is not known yet (:meth:`_past_waits`)."""
        lost = self._lost_of(state, msg)
        return self._past_waits(state, msg, lost) if lost else []

    def _lost_of(self, state: _Topic, msg: PubMessage) -> list[Dep]:
        """The publications ``msg`` names whose causal past is unknown here
        (:meth:`_unknown_past`; not seen here, and not in ``skipped_past``)."""
        buffer = state.buffer
        named = list(buffer.unmet(msg.dep_lookup()))  # delivered here: not lost
        if msg.prev >= 0:
            prev = MsgId(msg.id.source, msg.id.incarnation, msg.prev)
            if not buffer.known_met((prev,)):
                named.append(prev)
        if not named:
            return []
        past = state.skipped_past
        return [d for d in named if d not in past and self._unknown_past(state, d)]

    def _past_waits(self, state: _Topic, msg: PubMessage, lost: list[Dep]) -> list[Dep] | None:
        """What ``msg`` waits for in place of the unknown past of ``lost``: here,
        every held publication that may be in it (:func:`_held_before`)."""
        return list(_held_before(state, msg, lost))

    def _await_marks(self, state: _Topic, msg: PubMessage) -> list[Output]:
        """Keep ``msg`` until :meth:`_past_waits` can answer (overridden where
        fence decisions exist, ``topics._fence``; here it always can)."""
        raise NotImplementedError

    def _unknown_past(self, state: _Topic, dep: MsgId) -> bool:
        """Whether publication ``dep`` will never be delivered here and never
        came here: gone (:meth:`_gone`), or skipped under a ``predates`` mark
        that no bound backs (a SUB ACK's: a publication its sub-tree received
        before acknowledging, possibly after its source learnt of the
        subscription, so what it follows may be owed here)."""
        src, inc, seq = dep
        if not state.buffer.satisfied(dep):
            return self._gone(state, dep)
        bound = state.bounds.get((src, inc))
        # A DEAD_BOUND is said of a crashed source by others, not by it: no
        # closure argument (docs/protocol.md) backs what it skips.
        if bound != DEAD_BOUND and (bound is not None or seq >= state.predates.get((src, inc), 0)):
            return False
        key = _stream_key(src, inc)
        return not state.first_rx.get(key, seq + 1) <= seq <= state.last_rx.get(key, -1)

    @staticmethod
    def _start_stream_at(state: _Topic, first: PubMessage) -> list[PubMessage]:
        """Stand in for a bound that will not come: ``first`` is the oldest
        publication of its stream held here, and its predecessor is not.

        That predecessor travelled in an earlier round of the source, which
        completed before the next one started, so had this subscription been
        among its destinations it would be here: it predates the subscription.
        So ``first`` becomes the stream's first owned publication (older ones
        are skipped) and its predecessor counts as settled.  Returns what that
        releases.  For a crashed source that gave no bound, and for a
        newcomer's stream below its announce bound (:meth:`_synced`).
        """
        stream = (first.id.source, first.id.incarnation)
        state.bounds[stream] = first.id.seq
        state.inferred.add(stream)
        state.blind = state.blind or state.lonely  # its predecessor: skipped unseen
        return state.buffer.advance(first.id.source, first.id.incarnation, first.prev)

    @staticmethod
    def _skipped(state: _Topic, msg: PubMessage) -> bool:
        """Whether ``msg`` predates this subscription: never delivered, never waited for."""
        return _predates(state, msg.id.source, msg.id.incarnation, msg.id.seq)

    @staticmethod
    def _unseen_skip(state: _Topic, msg: PubMessage) -> bool:
        """Whether a publication ``msg`` names directly (or its predecessor in
        its stream) is skipped here (:meth:`_skipped`) without having come
        here in this subscription (``state.seen``): its causal past is
        unknown here, so a lonely subscription turns ``blind`` (:meth:`_follows_op`)."""
        seen, last_rx = state.seen, state.last_rx
        deps = [(d.source, d.incarnation, d.seq) for d in msg.deps]
        if msg.prev >= 0:
            deps.append((msg.id.source, msg.id.incarnation, msg.prev))
        for src, inc, seq in deps:
            key = _stream_key(src, inc)
            first = seen.get(key)
            unseen = first is None or seq < first or seq > last_rx.get(key, -1)
            if unseen and _predates(state, src, inc, seq):
                return True
        return False

    def _live_deps(self, state: _Topic, msg: PubMessage) -> Collection[Dep]:
        """:func:`_deps` without what can never come: ops of crashed nodes (never
        learned, nor needed) and publications of retired streams (see :meth:`_confirm`).

        A skipped publication counts as delivered, so what depends on it would
        not wait for its causal past, part of which may well be delivered here
        (published after this subscription, or by a source that gave a bound):
        so a dependency on a skipped publication seen here brings in what that
        one waited for (:meth:`_remember_skipped`), keeping causal order
        through it.
        """
        if not (
            msg.op_deps
            or msg.prev >= 0
            or state.skipped_past
            or self._dead
            or self.incarnation
            or state.retired
        ):
            return msg.dep_lookup()  # what _deps and the filters below would give, uncopied
        deps = _deps(msg)
        if state.skipped_past:
            past = state.skipped_past
            deps.extend(d for dep in list(deps) for d in past.get(dep, ()))
        if self._dead or self.incarnation or state.retired:  # else nothing can be gone
            deps = [d for d in deps if not self._gone(state, d)]
        return deps

    def _remember_skipped(self, state: _Topic, msg: PubMessage) -> None:
        """Note what skipped ``msg`` waited for (transitively through earlier skipped
        ones), for :meth:`_live_deps`; the oldest note goes beyond SKIPPED_PAST."""
        past = state.skipped_past
        key = (msg.id.source, msg.id.incarnation, msg.id.seq)
        if key in past:  # noted already (_confirm notes the early ones first)
            return
        if state.lonely:
            _note_seen(state, msg)
            state.blind = state.blind or self._unseen_skip(state, msg)
            self._note_follower(state, msg)
        self._note_past(state, msg)

    def _note_past(self, state: _Topic, msg: PubMessage) -> None:
        """Note in ``skipped_past`` what ``msg``, seen here and never to be
        delivered here, still waited for: what names it waits for that instead."""
        past = state.skipped_past
        key = (msg.id.source, msg.id.incarnation, msg.id.seq)
        if key in past:
            return
        # Only what is still missing: the notes stay as small as the gaps.
        deps = self._live_deps(state, msg)
        waits = dict.fromkeys(d for d in deps if not state.buffer.satisfied(d))
        past[key] = tuple(waits)
        if len(past) > SKIPPED_PAST:
            del past[next(iter(past))]

    def _gone(self, state: _Topic, dep: Dep) -> bool:
        """Whether ``dep`` names something that will never come (see :meth:`_live_deps`).

        This node's own earlier incarnations count as crashed: a restarted
        node holds nothing of its previous life.
        """
        stream, inc = dep[0], dep[1]
        node = -stream - 1 if stream < 0 else stream
        if node == self.id:
            return inc < self.incarnation
        if stream < 0:
            return self._is_dead(node, inc)
        if state.fences:  # past where a crashed stream was agreed to end (topics._fence)
            fenced = state.fences.get(_stream_key(stream, inc))
            if fenced is not None and fenced.decided is not None and dep[2] > fenced.decided:
                return True
        return inc <= state.retired.get(stream, -1) and (stream, inc) not in state.bounds

    def _note_held(self) -> None:
        """Keep ``pending_max`` (only called when something was just held back)."""
        held = sum(t.kept() for t in self._topics.values())
        self.pending_max = max(self.pending_max, held)

    def _release(self, state: _Topic, ready: list[PubMessage]) -> list[Output]:
        """Deliver ``ready`` and everything their delivery unblocks (CHECKDELIVERY).

        First in, first out: ``work`` only grows, read by index (a ``pop(0)``
        would shift it each time)."""
        out: list[Output] = []
        work = list(ready)
        barrier, deliver, name = state.barrier, state.buffer.deliver, state.name
        lonely, bridges = state.lonely, state.bridges
        i = 0
        while i < len(work):
            msg = work[i]
            i += 1
            mid = msg.id
            if lonely:
                state.blind = state.blind or self._unseen_skip(state, msg)
                if not self._follows_op(state, msg) and state.blind:
                    work.extend(deliver(mid))  # settled, not delivered: not owed here
                    if bridges:
                        work.extend(_cross(state, mid))
                    continue
            barrier.delivered(mid, msg.dep_lookup(), msg.op_deps)
            out.append(Delivered(name, mid, msg.payload, False, msg.deps))
            work.extend(deliver(mid))
            if bridges:
                work.extend(_cross(state, mid))
            if state.relay_unowed:
                # Delivered here, so owed on: relayed at the source's crash even
                # after an unsubscription (it came before the confirmation,
                # verify profile seed 425968: the only node that had it
                # delivered it at its confirmation, unsubscribed, and did not
                # relay it; a subscriber it was owed to never got it).
                state.relay_unowed.discard(_stream_key(mid.source, mid.incarnation))
        return out

    def _follows_op(self, state: _Topic, msg: PubMessage) -> bool:
        """Whether ``msg``, whose predecessors are all settled here, causally
        follows this (lonely) subscription's op: it names the op (or a later
        one of this node's life), or a publication seen here that does
        (``state.follows``, per stream the first, delivered or skipped
        (:meth:`_note_follower`); FIFO makes later ones follow).

        Why a ``blind`` subscription delivers only those.  A lonely
        subscription's members learn of it one by one, so a publication is
        owed to it only if its source knew the op; the source's barrier then
        led to the op, so an owed publication follows it, and so does
        everything after it.  One that does not follow the op is owed
        nowhere here, and may lie in the causal past of a publication this
        node skipped unseen (whose past is unknown here, :meth:`_unseen_skip`):
        delivered after a successor of that one, it would break causal order
        (docs/failures.md, seeds 20438 and 21594193).  Causal order holds
        for what is delivered after the first unseen skip: a chain from a
        publication that follows the op runs through publications that
        follow it too, all owed, so none skipped unseen (a bound or frontier
        covers nothing owed); before that skip, a skip is of a publication
        seen here, whose missing past successors wait for
        (:meth:`_remember_skipped`).
        """
        key = _stream_key(msg.id.source, msg.id.incarnation)
        first = state.follows.get(key)
        found = (first is not None and msg.prev >= first) or self._names_follower(state, msg)
        if found and first is None:
            state.follows[key] = msg.id.seq
        return found

    def _note_follower(self, state: _Topic, msg: PubMessage) -> None:
        """A skipped ``msg`` that follows this (lonely) subscription's op still
        makes what names it follow the op (``state.follows``): following is
        causal, not a matter of delivery.  Verify profile, seed 14619893: a
        blind subscription skipped node 4's (4, 1), which names its op, under
        node 4's announce bound, then settled node 0's (0, 4), owed there,
        which names (4, 1) but not the op, undelivered."""
        key = _stream_key(msg.id.source, msg.id.incarnation)
        first = state.follows.get(key)
        if (first is None or msg.id.seq < first) and self._names_follower(state, msg):
            state.follows[key] = msg.id.seq

    def _names_follower(self, state: _Topic, msg: PubMessage) -> bool:
        """Whether ``msg`` names this subscription's op (or a later op of this
        node's life) or a publication seen here that follows it, delivered or
        skipped (``state.follows``, :meth:`_follows_op`, :meth:`_note_follower`)."""
        me, life, rc = self.id, self.incarnation, state.sub_rc
        if any(o.source == me and o.incarnation == life and o.seq >= rc for o in msg.op_deps):
            return True
        follows = state.follows
        for d in msg.deps:
            first = follows.get(_stream_key(d.source, d.incarnation))
            if first is not None and d.seq >= first:
                return True
        return False

    def _new_subscriber(self, state: _Topic, op: ViewEntry) -> list[Output]:
        """``op``'s SUB round reached this confirmed subscription, which has no
        bound for its stream: the source's publications below the op came in
        rounds that completed before that round started (one round at a time
        per source), so what of them is not here was not sent here and never
        comes.  They are skipped (``predates``), down to the oldest held.

        Without it a subscriber that missed a resubscription (its view had the
        source unsubscribed) waited for good for the publication before the
        source's first one in its new subscription (verify profile, seed 1027).
        """
        stream = (op.node, op.incarnation)
        if stream in state.bounds:
            return []
        oldest = _oldest_held(state, op.node, op.incarnation)
        first = op.rc if oldest is None else min(op.rc, oldest.id.seq)
        if first <= state.predates.get(stream, 0):
            return []
        state.predates[stream] = first
        return self._release(state, state.buffer.advance(op.node, op.incarnation, first - 1))

    def _op_learned(self, state: _Topic, entry: ViewEntry) -> list[Output]:
        """Release what waited for ``entry`` (or an older op of its node)."""
        stream = op_stream(entry.node)
        ready = state.buffer.advance(stream, entry.incarnation, entry.rc)
        if entry.incarnation:
            ready.extend(state.buffer.retire_below(stream, entry.incarnation))
        return self._release(state, ready)

    def _learn(self, state: _Topic, entry: ViewEntry) -> list[Output]:
        """Record ``entry`` if it is newer than what this node knew (UPDATE, lines 81-87).

        A newly learned op of another node joins the causal barrier, so the
        next publication here is causally after it.
        """
        if not entry.newer_than(state.view.get(entry.node)) or self._is_dead(
            entry.node, entry.incarnation
        ):
            return []
        state.set_entry(entry)
        if entry.incarnation > self._life.get(entry.node, 0):
            self._life[entry.node] = entry.incarnation
        state.learned_at[entry.node] = self._counter
        if entry.node != self.id:
            state.barrier.learned_op(entry.op_id)
        return self._op_learned(state, entry) if state.confirmed else []

"""Agreement on where a crashed source's stream ends (docs/failures.md,
"the agreement case").

A crash relay passes on a dead source's last round only from nodes that hold
it and live to hear of the crash.  When every holder crashes first, a
subscriber can wait for good on a publication nobody alive has, held behind
it by what a dead publisher built on it.  To deliver what waits, the
subscriber must give that publication up, which is sound only once no live
node can deliver it any more.  The fence decides that, once per topic and
crashed stream, under the perfect detector the rest of the core assumes:

* *Ask.*  A subscriber holding a publication of a dead publisher that waits
  on a dead stream asks the coordinator, the lowest live id it knows.
* *Poll.*  The coordinator asks every live member it knows (QUERY).  Each
  answers (ANSWER) the highest sequence number of the stream it received,
  with the stream's last round up to it, what it holds of other crashed
  sources and its own mark, and from then on delivers nothing of the stream above its
  answer: a later copy waits in its stash.  A member that knows a decision
  answers with it (DECIDED).
* *Decide.*  Once every member asked answered or is known crashed, ``L`` is a
  reported decision if there is one, else the largest answer; the
  coordinator sends it with the publications up to it and the other
  crashed sources' publications the members hold (DECISION) to every live
  member.
* *Apply.*  A member takes those publications (as relays), drops its stash
  above ``L``, and counts every wait on the stream above ``L`` as met for
  good.  What that releases took the given-up publications' causal past
  with it, unknown here: it is kept until each live member's stream came
  here up to the mark that member's answer gave (``Fence.marks``: how far
  its own stream had come), then waits for every publication held here
  that may be in that past (:meth:`_Fence._fence_release`).
* *Coordinator crash.*  A member waiting for a decision, or the asker, asks
  the next lowest live id; members that applied a decision report it, so the
  next poll decides the same.
* *Not known crashed yet.*  A FENCE about a stream whose source this node
  does not know to have crashed waits until the detector says so: acting
  on it would freeze or cut a stream the node believes live.
* *Two coordinators* (views that disagree on the lowest live id): one that
  a lower id queries while it polls gives way, and passes the lower one's
  decision on to the members it asked.

Invariant: a member delivers nothing of a stream above its answer before a
decision, and applies one decision per stream; every decision is at least
every answer of a member alive at the decision, and carries the
publications up to it.  So nothing above ``L`` was delivered by a member
that was asked, and everything up to ``L`` reaches every member that gets
the decision.  Not covered: a member the coordinator does not know
(partial membership), or two coordinators that do not know of each other.

One protocol, one file past the usual 600 lines: its four steps read and
write the same per-topic fence state, and split apart each would hold half
of every invariant.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from causal import Dep, MsgId
from topics._delivery import _deps, _held_before, _predates
from topics._errors import RemoteProtocolError
from topics._events import Output, Send
from topics._messages import (
    FENCE_ANSWER,
    FENCE_ASK,
    FENCE_DECIDED,
    FENCE_DECISION,
    FENCE_QUERY,
    Fence,
    PubMessage,
    RoundId,
)
from topics._repair import _dead_stream, _Repair
from topics._state import (
    DEAD_BOUND,
    FENCE_LATER,
    StreamKey,
    _Fenced,
    _Poll,
    _stream_key,
    _stream_of,
    _Topic,
)


def _note_marks(marks: dict[tuple[int, int], int], found: Iterable[MsgId]) -> None:
    """Keep the highest mark per member stream (``Fence.marks``)."""
    for src, inc, seq in found:
        if seq > marks.get((src, inc), -1):
            marks[(src, inc)] = seq


def _fence_later(state: _Topic, key: StreamKey, sender: int, packet: Fence) -> None:
    """Keep ``packet`` until this node learns that ``key``'s source crashed.

    Acting on it now would freeze or cut a stream this node believes live:
    an honest coordinator heard of the crash first (the detector tells
    nodes at different times), and anything else must not stop a live
    stream.  The newest packet per sender is kept, at most FENCE_LATER."""
    later = state.fence_later
    later.setdefault(key, {})[sender] = packet
    if sum(len(v) for v in later.values()) > FENCE_LATER:
        del later[next(iter(later))]


class _Fence(_Repair):
    """Agreement on crashed streams (see the module docstring)."""

    # Defined by _Receive (topics._receive), which builds on this class; real
    # methods, not TYPE_CHECKING stubs, which mypyc's build does not accept.
    def _check_remote(self, topic: str, messages: tuple[PubMessage, ...] = ()) -> None:
        raise NotImplementedError

    def _fresh(
        self, last_rx: dict[StreamKey, int], messages: tuple[PubMessage, ...]
    ) -> tuple[tuple[PubMessage, ...], int | None]:
        raise NotImplementedError

    def crashed(self, node: int, incarnation: int, now: float) -> list[Output]:
        known = self._is_dead(node, incarnation) or node == self.id
        out = super().crashed(node, incarnation, now)
        if not known:
            for state in list(self._topics.values()):
                out.extend(self._fence_on_crash(state, node, incarnation))
        return out

    def _open(self, state: _Topic) -> list[Output]:
        out = super()._open(state)
        if self._dead and len(state.buffer):  # what came early may wait on the dead
            out.extend(self._fence_held(state, state.buffer.items()))
        return out

    # -------------------------------------------------------------- asking

    def _fence_on_crash(self, state: _Topic, node: int, incarnation: int) -> list[Output]:
        """``node`` up to ``incarnation`` crashed: FENCE packets kept about its
        streams are taken now, polls stop waiting for it, questions to it go
        to the next coordinator, and what it left held asks."""
        out: list[Output] = []
        for key in [k for k in state.fence_later if _dead_stream(k, node, incarnation)]:
            for sender, packet in state.fence_later.pop(key).items():
                out.extend(self._on_fence(sender, packet))
        for key, poll in list(state.polls.items()):
            life = poll.waiting.get(node)
            if life is not None and life <= incarnation:
                del poll.waiting[node]
                out.extend(self._poll_done(state, key, poll))
        for key, fenced in list(state.fences.items()):
            if fenced.decided is None and fenced.coordinator == node:
                out.extend(self._fence_ask(state, key))
        for key, asked in list(state.fence_asked.items()):
            if asked == node and key not in state.fences:
                out.extend(self._fence_ask(state, key))
        if state.confirmed and len(state.buffer):
            out.extend(self._fence_held(state, state.buffer.items()))
        if state.marked:  # a crashed member's mark no longer counts
            out.extend(self._marks_came(state))
        return out

    def _fence_held(self, state: _Topic, msgs: Iterable[PubMessage]) -> list[Output]:
        """Ask about every dead stream a held publication of a dead publisher
        waits on and that never came here: no live node may hold it (a live
        publisher relays what it built on at the crash, so only a dead one
        leaves this to the fence)."""
        out: list[Output] = []
        buffer = state.buffer
        for msg in msgs:
            src, inc = msg.id.source, msg.id.incarnation
            if not self._is_dead(src, inc) or buffer.satisfied(msg.id):
                continue
            out.extend(self._fence_asks(state, _deps(msg)))  # ops are never dead streams
        return out

    def _past_waits(self, state: _Topic, msg: PubMessage, lost: list[Dep]) -> list[Dep] | None:
        """The held publications that may precede ``lost``, once every live
        member's stream has come here up to its mark in the decisions on the
        crashed streams of ``lost``, if any: what a given-up publication
        followed may still be on its way here.  ``None`` until then
        (:meth:`_await_marks` keeps ``msg``)."""
        if self._undecided(state, lost) or self._marks_coming(state, self._lost_marks(state, lost)):
            return None
        return list(_held_before(state, msg, lost))

    def _undecided(self, state: _Topic, lost: list[Dep]) -> set[StreamKey]:
        """The crashed streams of ``lost`` (not this node's own) with no decision
        here: what their skipped publications followed is unknown until one
        says how far live members' streams had come (verify profile, seed 0,
        15 nodes, detection 3,000 + U(0, 3,000): node 2, confirmed after node
        5 crashed, delivered (6, 1), which names 5's skipped (5, 1), before
        (13, 1), which (5, 1) follows, late behind a crashed relay)."""
        found: set[StreamKey] = set()
        for src, inc, _ in lost:
            key = _stream_key(src, inc)
            fenced = state.fences.get(key)
            if fenced is not None and fenced.decided is not None:
                continue
            if src != self.id and (
                self._is_dead(src, inc)
                or inc <= state.retired.get(src, -1)
                or state.bounds.get((src, inc)) == DEAD_BOUND
            ):  # a retired life, or one the SUB ACK called crashed, is dead
                found.add(key)  # too, even before this node's detector says so
        return found

    def _lost_marks(self, state: _Topic, lost: list[Dep]) -> tuple[MsgId, ...]:
        """The marks of the decisions on the crashed streams of ``lost``."""
        marks: list[MsgId] = []
        for key in {_stream_key(d[0], d[1]) for d in lost}:
            fenced = state.fences.get(key)
            if fenced is not None and fenced.decided is not None:
                marks.extend(fenced.marks)
        return tuple(marks)

    def _await_marks(self, state: _Topic, msg: PubMessage) -> list[Output]:
        """Keep ``msg`` until every crashed stream it lost the past of is decided
        (asking for the decisions not asked for yet; :meth:`_fence_apply`
        considers it again), then until the marks came (:meth:`_marks_came`)."""
        out: list[Output] = []
        keys = self._undecided(state, self._lost_of(state, msg))
        for key in keys:
            state.awaiting.setdefault(key, {})[msg.id] = msg
            if key not in state.fence_asked and key not in state.fences:
                out.extend(self._fence_ask(state, key))
        if not keys:
            state.marked[msg.id] = (msg, None)
        self._note_held()
        return out

    def _fence_needed(self, state: _Topic, dep: Dep) -> bool:
        """Whether ``dep`` is of a dead stream not yet asked about, missing here."""
        src, inc, seq = dep
        key = _stream_key(src, inc)
        return not (
            src == self.id
            or not self._is_dead(src, inc)
            or key in state.fence_asked
            or key in state.fences
            or state.last_rx.get(key, -1) >= seq  # it came: it waits for its own
            or state.buffer.satisfied(dep)
            or self._gone(state, dep)
        )

    def _coordinator(self) -> int:
        """The lowest id this node knows live (itself included)."""
        return min([*self._live_others(), self.id])

    def _live_others(self) -> list[int]:
        """The other members this node knows live, sorted."""
        return sorted(n for n in self.overlay.members if n != self.id and not self._known_dead(n))

    def _fence_packet(
        self,
        state: _Topic,
        key: StreamKey,
        value: int,
        step: int,
        messages: tuple[PubMessage, ...] = (),
        others: tuple[PubMessage, ...] = (),
        marks: tuple[MsgId, ...] = (),
    ) -> Fence:
        """A FENCE on ``state``'s stream ``key`` from this node's life."""
        src, inc = _stream_of(key)
        life = RoundId(self.id, self.incarnation, 0)
        return Fence(life, state.name, MsgId(src, inc, value), step, messages, others, marks)

    def _own_mark(self, state: _Topic) -> MsgId:
        """How far this node's own stream on ``state`` has come (Fence.marks)."""
        return MsgId(self.id, self.incarnation, state.last_pub)

    def _fence_ask(self, state: _Topic, key: StreamKey) -> list[Output]:
        """Ask the coordinator to decide stream ``key`` (or poll, if this node is it)."""
        coordinator = self._coordinator()
        state.fence_asked[key] = coordinator
        fenced = state.fences.get(key)
        if fenced is not None:
            fenced.coordinator = coordinator
        if coordinator == self.id:
            return self._poll_start(state, key)
        return [Send(coordinator, self._fence_packet(state, key, -1, FENCE_ASK))]

    # --------------------------------------------------------------- polling

    def _poll_start(self, state: _Topic, key: StreamKey, asker: int | None = None) -> list[Output]:
        """Poll every live member on ``key``; this node answers itself first.
        ``asker``, who asked for the poll (or asks while it runs), is told the
        decision too: this node may not know it as a member yet (a restarted
        node's new life; state machine of ``tests/test_properties.py``, verify
        profile: the new life of node 777 asked node 132, which polled and
        decided without it, and held a publication for good)."""
        fenced = state.fences.get(key)
        old = state.polls.get(key)
        if old is not None and not old.deferred:
            if asker is not None:
                old.askers.add(asker)  # told with everyone else (_poll_done)
            return []
        if fenced is not None and fenced.decided is not None:
            return self._fence_tell(state, key, self._decided_packet(state, key, fenced))
        members = set(self._live_others())
        if old is not None:  # it gave way to a coordinator that crashed: poll again
            members.update(n for n in old.asked if not self._known_dead(n))
        poll = state.polls[key] = _Poll({n: self._life.get(n, 0) for n in members})
        if old is not None:  # who asked the poll that gave way still waits to be told
            poll.askers.update(n for n in old.askers if not self._known_dead(n))
        if asker is not None:
            poll.askers.add(asker)
        self._poll_note(poll, self._fence_answer(state, key, self.id))
        query = self._fence_packet(state, key, -1, FENCE_QUERY)
        out: list[Output] = [Send(n, query) for n in sorted(poll.waiting)]
        out.extend(self._poll_done(state, key, poll))
        return out

    @staticmethod
    def _poll_note(poll: _Poll, answer: Fence) -> None:
        """Take one member's answer: a decision wins, else the largest answer;
        what it holds of other crashed sources goes with the decision."""
        value, content = answer.stream.seq, answer.messages
        if answer.step == FENCE_DECIDED:
            if poll.decided is None:
                poll.decided, poll.content = value, content
        elif poll.decided is None and value > poll.best:
            poll.best, poll.content = value, content
        for m in answer.others:
            poll.others.setdefault(m.id, m)
        _note_marks(poll.marks, answer.marks)

    def _poll_done(self, state: _Topic, key: StreamKey, poll: _Poll) -> list[Output]:
        """Decide once nobody asked is left to answer, and tell every live member."""
        if poll.waiting or poll.deferred:
            return []
        del state.polls[key]
        value = poll.decided if poll.decided is not None else poll.best
        # What this node got of other crashed sources since its own answer
        # (the poll's first) goes too: a copy still in flight then may precede
        # what the decision gives up (burst seed 392, links 40 + N(0, 150)).
        for m in self._dead_held(state, key):
            poll.others.setdefault(m.id, m)
        _note_marks(poll.marks, (self._own_mark(state),))
        others = tuple(poll.others.values())[: self.config.max_round_messages]
        marks = tuple(MsgId(n, i, s) for (n, i), s in sorted(poll.marks.items()))
        decision = self._fence_packet(
            state, key, value, FENCE_DECISION, poll.content, others, marks
        )
        return self._fence_tell(state, key, decision, poll.askers.union(poll.asked))

    def _decided_packet(self, state: _Topic, key: StreamKey, fenced: _Fenced) -> Fence:
        """The DECISION this node applied on ``key`` (``fenced.decided`` is set),
        with what came with it: what it tells again to whoever asks."""
        assert fenced.decided is not None
        content = self._fence_content(state, key)
        return self._fence_packet(
            state, key, fenced.decided, FENCE_DECISION, content, fenced.others, fenced.marks
        )

    def _fence_tell(
        self, state: _Topic, key: StreamKey, decision: Fence, also: Iterable[int] = ()
    ) -> list[Output]:
        """Send ``decision`` to every live member, and to ``also`` (those that
        asked or were asked, which this node may not know as members yet),
        then apply it here."""
        to = set(self._live_others()).union(n for n in also if not self._known_dead(n))
        to.discard(self.id)
        out: list[Output] = [Send(n, decision) for n in sorted(to)]
        out.extend(self._fence_apply(state, key, decision))
        return out

    # ------------------------------------------------------------- answering

    def _fence_answer(self, state: _Topic, key: StreamKey, coordinator: int) -> Fence:
        """This node's answer on ``key`` to ``coordinator``: its decision, or
        the highest sequence number it received, which it then promises not
        to deliver past; with the stream's last round, and what it holds of
        other crashed sources (:meth:`_dead_held`)."""
        fenced = state.fences.get(key)
        if fenced is None:
            fenced = state.fences[key] = _Fenced(state.last_rx.get(key, -1), coordinator)
        step, value, marks = FENCE_DECIDED, fenced.decided, fenced.marks
        if value is None:
            fenced.coordinator = coordinator
            step, value, marks = FENCE_ANSWER, fenced.frozen, (self._own_mark(state),)
        content = self._fence_content(state, key)
        others = self._dead_held(state, key)
        return self._fence_packet(state, key, value, step, content, others, marks)

    def _dead_held(self, state: _Topic, key: StreamKey) -> tuple[PubMessage, ...]:
        """The publications of crashed sources other than ``key``'s this node
        received (their last rounds, and what it holds back): one of them may
        precede the publications the decision gives up, and a member that
        releases what waited on those must have it first
        (:meth:`_fence_release`).  At most ``max_round_messages``."""
        found: dict[MsgId, PubMessage] = {}
        rounds = [d.messages for d in state.dead_rounds.values()]
        rounds.extend(m for k, m in state.last_round.items() if self._is_dead(*_stream_of(k)))
        rounds.append(tuple(state.buffer.items()))
        rounds.append(tuple(state.early))
        for msgs in rounds:
            for m in msgs:
                if self._is_dead(m.id.source, m.id.incarnation):
                    found.setdefault(m.id, m)
        src, inc = _stream_of(key)
        mine = [m for i, m in sorted(found.items()) if (i.source, i.incarnation) != (src, inc)]
        return tuple(mine[-self.config.max_round_messages :])

    @staticmethod
    def _fence_content(state: _Topic, key: StreamKey) -> tuple[PubMessage, ...]:
        """The stream's last round as received here, up to what this node may
        deliver (a decision's own publications, once it has one)."""
        fenced = state.fences.get(key)
        if fenced is not None and fenced.content:
            return fenced.content
        msgs = state.last_round.get(key)
        if msgs is None:
            dead = state.dead_rounds.get(key)
            msgs = dead.messages if dead is not None else ()
        if fenced is None:
            return msgs
        top = fenced.decided if fenced.decided is not None else fenced.frozen
        return tuple(m for m in msgs if m.id.seq <= top)

    @staticmethod
    def _fence_split(
        state: _Topic, messages: tuple[PubMessage, ...]
    ) -> tuple[tuple[PubMessage, ...], tuple[PubMessage, ...]]:
        """A round's publications this node may take now, and those it must
        hold: of a fenced stream, nothing above its answer before a decision
        (held, see :meth:`_fence_hold`), nothing above the decision after it
        (dropped).  Pure, so that a round that turns out malformed (the
        caller checks it next) changes nothing; a round that mixes streams
        or whose ids do not increase is left whole, so that check refuses it
        (above a decision it would otherwise be dropped unchecked)."""
        first = messages[0].id
        src, inc = first.source, first.incarnation
        fenced = state.fences.get(_stream_key(src, inc))
        if fenced is None:
            return messages, ()
        top = fenced.decided if fenced.decided is not None else fenced.frozen
        if messages[-1].id.seq <= top:
            return messages, ()
        if any(m.id.source != src or m.id.incarnation != inc for m in messages):
            return messages, ()
        if any(a.id.seq >= b.id.seq for a, b in pairwise(messages)):
            return messages, ()
        kept = tuple(m for m in messages if m.id.seq <= top)
        if fenced.decided is not None:
            return kept, ()
        return kept, tuple(m for m in messages if m.id.seq > top)

    def _fence_keep(
        self,
        state: _Topic,
        whole: tuple[PubMessage, ...],
        kept: tuple[PubMessage, ...],
        held: tuple[PubMessage, ...],
    ) -> None:
        """Carry out :meth:`_fence_split` of ``whole`` into ``kept`` and ``held``,
        once the round passed its checks: ``held`` waits for the decision, and
        what lies above a decision is given up but was seen here, so what names
        it waits for its past instead (``skipped_past``, burst seed 801420).
        ``whole`` is a round of one stream in increasing order (the caller's
        checks refuse any other before this runs)."""
        if held:
            self._fence_hold(state, held)
        for m in whole[len(kept) + len(held) :]:
            self._note_past(state, m)

    @staticmethod
    def _fence_hold(state: _Topic, held: tuple[PubMessage, ...]) -> None:
        """Keep ``held`` (from :meth:`_fence_split`) until the decision."""
        first = held[0].id
        fenced = state.fences[_stream_key(first.source, first.incarnation)]
        for m in held:
            fenced.stash.setdefault(m.id.seq, m)

    def _fence_apply(self, state: _Topic, key: StreamKey, decision: Fence) -> list[Output]:
        """Apply ``decision`` on ``key`` (once): take what leads up to it and
        what members hold of other crashed sources, drop what lies beyond,
        and release what waited beyond it (:meth:`_fence_release`)."""
        value = decision.stream.seq
        fenced = state.fences.get(key)
        if fenced is None:
            fenced = state.fences[key] = _Fenced(state.last_rx.get(key, -1), self.id)
        if fenced.decided is not None:
            return []
        fenced.decided = value
        self.fence_decisions += 1
        taken = {m.id.seq: m for m in fenced.stash.values() if m.id.seq <= value}
        taken.update((m.id.seq, m) for m in decision.messages if m.id.seq <= value)
        for m in fenced.stash.values():
            if m.id.seq > value:  # given up, but seen: what names it waits for its past
                self._note_past(state, m)
        fenced.stash = {}
        fenced.content = tuple(m for m in decision.messages if m.id.seq <= value)
        fenced.others = decision.others
        fenced.marks = decision.marks
        state.fence_asked.pop(key, None)
        out = self._fence_pass_on(state, key, decision)
        out.extend(self._fence_take(state, tuple(taken[s] for s in sorted(taken))))
        out.extend(self._fence_take_others(state, decision.others))
        src, inc = _stream_of(key)
        released = state.buffer.settle_above(src, inc, value)
        out.extend(self._fence_release(state, key, released, decision.marks))
        if state.confirmed and len(state.buffer):
            out.extend(self._fence_held(state, state.buffer.items()))
        for msg in state.awaiting.pop(key, {}).values():
            if not any(msg.id in k for k in state.awaiting.values()):
                out.extend(self._consider(state, msg))  # it may wait for another
        return out

    def _fence_release(
        self,
        state: _Topic,
        key: StreamKey,
        released: list[PubMessage],
        marks: tuple[MsgId, ...] = (),
    ) -> list[Output]:
        """Deliver what the decision on ``key`` released, each once nothing
        here may precede it: a publication given up took its causal past with
        it, so what waited on it also waits for every held publication that
        may be in that past (:func:`~topics._delivery._held_before`), and for
        each live member's stream up to its mark, owed here and perhaps still
        on its way (burst seed 11954, ``--detect 50,25 --tpp-stdev 300``: live
        node 5's (5, 1) reached node 4 after the decision that released (0, 1),
        which named the given-up (1, 1), which followed (5, 1))."""
        out: list[Output] = []
        src, inc = _stream_of(key)
        coming = self._marks_coming(state, marks)
        for msg in released:
            if coming:  # what it may follow is still on its way: first that comes
                state.marked[msg.id] = (msg, key)
                continue
            named = [d for d in _deps(msg) if d[0] == src and d[1] == inc]
            lost = max((d[2] for d in named), default=-1)
            before: list[Dep] = [*_held_before(state, msg, [(src, inc, lost)])]
            before += self._given_up_past(state, named)
            if before and not state.buffer.add(msg, before):
                state.fence_held[msg.id] = ((), tuple(before))
                out.extend(self._fence_asks(state, before))
                continue
            out.extend(self._release(state, [msg]))
        return out

    def _given_up_past(self, state: _Topic, named: list[Dep]) -> list[Dep]:
        """What the given-up publications of ``named`` that came here (noted
        in ``skipped_past``) still waited for and may still come: a crashed
        source's publication in flight behind a fast detector is held by
        nobody, so no decision carries it (burst seed 801420, ``--detect
        50,25 --tpp-stdev 300``: node 0 delivered (4, 1), which names the
        given-up (6, 1), before (6, 1)'s predecessor (2, 1) came)."""
        past, buffer = state.skipped_past, state.buffer
        return [
            w
            for d in named
            for w in past.get(d, ())
            if not buffer.satisfied(w) and not self._gone(state, w)
        ]

    def _fence_asks(self, state: _Topic, waits: Iterable[Dep]) -> list[Output]:
        """Ask about each crashed stream of ``waits`` not asked about yet."""
        out: list[Output] = []
        for dep in waits:
            if self._fence_needed(state, dep):
                out.extend(self._fence_ask(state, _stream_key(dep[0], dep[1])))
        return out

    def _marks_coming(self, state: _Topic, marks: tuple[MsgId, ...]) -> bool:
        """Whether a live member's stream (``Fence.marks``) has not come here
        up to its mark, where owed here (a stream's publications that predate
        this subscription never come): it will, its source being live.  Its
        arrival is what counts, not its delivery: a publication of it that
        follows the one waiting is held until that one is delivered."""
        last_rx = state.last_rx
        return any(
            m.seq >= 0
            and m.source != self.id
            and last_rx.get(_stream_key(m.source, m.incarnation), -1) < m.seq
            and not self._known_dead(m.source)
            and not self._is_dead(m.source, m.incarnation)
            and not _predates(state, m.source, m.incarnation, m.seq)
            for m in marks
        )

    def _marks_came(self, state: _Topic) -> list[Output]:
        """Take up again what waited for the marks (:meth:`_fence_release`,
        :meth:`_await_marks`) once they came here, or their members crashed."""
        out: list[Output] = []
        for mid, (msg, key) in list(state.marked.items()):
            if key is not None:
                marks = state.fences[key].marks
                if self._marks_coming(state, marks):
                    continue
                del state.marked[mid]
                out.extend(self._fence_release(state, key, [msg], marks))
                continue
            if self._marks_coming(state, self._lost_marks(state, self._lost_of(state, msg))):
                continue
            del state.marked[mid]
            out.extend(self._consider(state, msg))
            if state.confirmed:  # held now for the past of one given up: ask about it
                out.extend(self._fence_held(state, [msg]))
        return out

    def _fence_pass_on(self, state: _Topic, key: StreamKey, decision: Fence) -> list[Output]:
        """A poll that gave way passes the decision on to everyone it asked
        and everyone who asked it (the lower coordinator may not know them)."""
        poll = state.polls.pop(key, None)
        if poll is None or not poll.deferred:
            return []
        value, msgs, others = decision.stream.seq, decision.messages, decision.others
        again = self._fence_packet(state, key, value, FENCE_DECISION, msgs, others, decision.marks)
        to = poll.askers.union(poll.asked).difference((self.id, decision.round.source))
        return [Send(n, again) for n in sorted(to) if not self._known_dead(n)]

    def _fence_take_others(self, state: _Topic, others: tuple[PubMessage, ...]) -> list[Output]:
        """Take ``others`` (publications of crashed sources, any streams) as
        relays, stream by stream, within what each fenced stream allows."""
        streams: dict[StreamKey, list[PubMessage]] = {}
        for m in others:
            streams.setdefault(_stream_key(m.id.source, m.id.incarnation), []).append(m)
        out: list[Output] = []
        for key, msgs in streams.items():
            run = tuple(sorted({m.id.seq: m for m in msgs}.values(), key=lambda m: m.id.seq))
            if key in state.fences:
                whole = run
                run, held = self._fence_split(state, run)
                self._fence_keep(state, whole, run, held)
            if run:
                out.extend(self._fence_take(state, run))
        return out

    def _fence_take(self, state: _Topic, msgs: tuple[PubMessage, ...]) -> list[Output]:
        """Take ``msgs`` (one stream, in order) as a relay of the stream's last round."""
        fresh, last_rx = self._fresh(state.last_rx, msgs)
        if not fresh or last_rx is None:
            return []
        if not state.preset:
            self._took(state, fresh)
        first = fresh[0].id
        state.last_rx[_stream_key(first.source, first.incarnation)] = last_rx
        out: list[Output] = []
        for msg in fresh:
            out.extend(self._on_publication(state, msg))
        if state.confirmed:
            out.extend(self._ask_bounds(state, fresh[:1], fresh))
        return out

    # ---------------------------------------------------------------- input

    def _on_fence(self, sender: int, packet: Fence) -> list[Output]:
        """A FENCE from ``sender``: checked whole before any state changes."""
        src, inc, value = packet.stream
        mine = src == self.id and inc >= self.incarnation  # an older life of its own is dead
        if sender == self.id or mine or not FENCE_ASK <= packet.step <= FENCE_DECISION:
            raise RemoteProtocolError(f"malformed FENCE from {sender}: {packet!r}")
        self._check_remote(packet.topic, packet.messages)
        self._check_remote(packet.topic, packet.others)
        own = {(sender, packet.round.incarnation)}
        if packet.marks and (
            packet.step in (FENCE_ASK, FENCE_QUERY)
            or (packet.step == FENCE_ANSWER and {m[:2] for m in packet.marks} != own)
        ):  # an answer marks its sender's own stream only; a question none
            raise RemoteProtocolError(f"FENCE from {sender} carries marks it may not")
        if packet.messages:
            self._fresh({}, packet.messages)  # one stream, in order
            last = packet.messages[-1].id
            if (last.source, last.incarnation) != (src, inc) or last.seq > value:
                raise RemoteProtocolError(f"FENCE from {sender} carries other publications")
        if self._is_dead(sender, packet.round.incarnation):
            return []  # a late word of a dead life: its promise died with it
        state = self._topic(packet.topic)
        key = _stream_key(src, inc)
        if not (self._is_dead(src, inc) or src == self.id):  # its own older lives are dead
            _fence_later(state, key, sender, packet)
            return []
        step = packet.step
        if step == FENCE_ASK:
            state.fence_asked.setdefault(key, self.id)
            fenced = state.fences.get(key)
            if fenced is not None and fenced.decided is not None:
                # decided already: the asker gets it even if this node does
                # not know it as a member yet (a restarted node's new life)
                return [Send(sender, self._decided_packet(state, key, fenced))]
            return self._poll_start(state, key, sender)
        if step == FENCE_QUERY:
            poll = state.polls.get(key)
            if poll is not None and sender < self.id:
                # Two coordinators: the higher gives way, so that one poll
                # decides (a decision already made is answered as DECIDED).
                poll.deferred = True
            return [Send(sender, self._fence_answer(state, key, sender))]
        if step == FENCE_DECISION:
            return self._fence_apply(state, key, packet)
        poll = state.polls.get(key)
        if poll is None or poll.waiting.pop(sender, None) is None:
            return []  # decided already, or not asked
        self._poll_note(poll, packet)
        return self._poll_done(state, key, poll)

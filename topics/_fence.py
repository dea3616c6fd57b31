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
  with the stream's last round up to it, and from then on delivers nothing
  of the stream above its answer: a later copy waits in its stash.  A member
  that knows a decision answers with it (DECIDED).
* *Decide.*  Once every member asked answered or is known crashed, ``L`` is a
  reported decision if there is one, else the largest answer; the
  coordinator sends it with the publications up to it (DECISION) to every
  live member.
* *Apply.*  A member takes the publications up to ``L`` (as a relay), drops
  its stash above ``L``, and counts every wait on the stream above ``L`` as
  met for good, which releases what waited on them.
* *Coordinator crash.*  A member waiting for a decision, or the asker, asks
  the next lowest live id; members that applied a decision report it, so the
  next poll decides the same.

Invariant: a member delivers nothing of a stream above its answer before a
decision, and applies one decision per stream; every decision is at least
every answer of a member alive at the decision, and carries the
publications up to it.  So nothing above ``L`` was delivered by a member
that was asked, and everything up to ``L`` reaches every member that gets
the decision.  Not covered: a member the coordinator does not know
(partial membership), or two coordinators at once (views that disagree on
the lowest live id).
"""

from __future__ import annotations

from collections.abc import Iterable

from causal import Dep, MsgId
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
from topics._repair import _Repair
from topics._state import StreamKey, _Fenced, _Poll, _stream_key, _stream_of, _Topic


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
        """``node`` up to ``incarnation`` crashed: polls stop waiting for it,
        questions to it go to the next coordinator, and what it left held asks."""
        out: list[Output] = []
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
            waits: list[Dep] = list(msg.deps)
            if msg.prev >= 0:
                waits.append((src, inc, msg.prev))
            for dep in waits:
                if self._fence_needed(state, dep):
                    out.extend(self._fence_ask(state, _stream_key(dep[0], dep[1])))
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
        live = [n for n in self.overlay.members if not self._known_dead(n)]
        return min(live, default=self.id) if live and min(live) < self.id else self.id

    def _fence_life(self) -> RoundId:
        return RoundId(self.id, self.incarnation, 0)

    def _fence_ask(self, state: _Topic, key: StreamKey) -> list[Output]:
        """Ask the coordinator to decide stream ``key`` (or poll, if this node is it)."""
        coordinator = self._coordinator()
        state.fence_asked[key] = coordinator
        fenced = state.fences.get(key)
        if fenced is not None:
            fenced.coordinator = coordinator
        if coordinator == self.id:
            return self._poll_start(state, key)
        src, inc = _stream_of(key)
        ask = Fence(self._fence_life(), state.name, MsgId(src, inc, -1), FENCE_ASK)
        return [Send(coordinator, ask)]

    # --------------------------------------------------------------- polling

    def _poll_start(self, state: _Topic, key: StreamKey) -> list[Output]:
        """Poll every live member on ``key``; this node answers itself first."""
        fenced = state.fences.get(key)
        if key in state.polls:
            return []
        src, inc = _stream_of(key)
        if fenced is not None and fenced.decided is not None:
            return self._fence_tell(state, key, fenced.decided, self._fence_content(state, key))
        members = [n for n in self.overlay.members if n != self.id and not self._known_dead(n)]
        poll = state.polls[key] = _Poll({n: self._life.get(n, 0) for n in members})
        step, value, content = self._fence_answer(state, key, self.id)
        self._poll_note(poll, step, value, content)
        query = Fence(self._fence_life(), state.name, MsgId(src, inc, -1), FENCE_QUERY)
        out: list[Output] = [Send(n, query) for n in sorted(poll.waiting)]
        out.extend(self._poll_done(state, key, poll))
        return out

    @staticmethod
    def _poll_note(poll: _Poll, step: int, value: int, content: tuple[PubMessage, ...]) -> None:
        """Take one member's answer: a decision wins, else the largest answer."""
        if step == FENCE_DECIDED:
            if poll.decided is None:
                poll.decided, poll.content = value, content
        elif poll.decided is None and value > poll.best:
            poll.best, poll.content = value, content

    def _poll_done(self, state: _Topic, key: StreamKey, poll: _Poll) -> list[Output]:
        """Decide once nobody asked is left to answer, and tell every live member."""
        if poll.waiting:
            return []
        del state.polls[key]
        value = poll.decided if poll.decided is not None else poll.best
        return self._fence_tell(state, key, value, poll.content)

    def _fence_tell(
        self, state: _Topic, key: StreamKey, value: int, content: tuple[PubMessage, ...]
    ) -> list[Output]:
        src, inc = _stream_of(key)
        decision = Fence(
            self._fence_life(), state.name, MsgId(src, inc, value), FENCE_DECISION, content
        )
        out: list[Output] = [
            Send(n, decision)
            for n in sorted(self.overlay.members)
            if n != self.id and not self._known_dead(n)
        ]
        out.extend(self._fence_apply(state, key, value, content))
        return out

    # ------------------------------------------------------------- answering

    def _fence_answer(
        self, state: _Topic, key: StreamKey, coordinator: int
    ) -> tuple[int, int, tuple[PubMessage, ...]]:
        """This node's answer on ``key``: its decision, or the highest sequence
        number it received, which it then promises not to deliver past."""
        fenced = state.fences.get(key)
        if fenced is None:
            fenced = state.fences[key] = _Fenced(state.last_rx.get(key, -1), coordinator)
        if fenced.decided is not None:
            return FENCE_DECIDED, fenced.decided, self._fence_content(state, key)
        fenced.coordinator = coordinator
        return FENCE_ANSWER, fenced.frozen, self._fence_content(state, key)

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
        is left whole for that check."""
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
        kept = tuple(m for m in messages if m.id.seq <= top)
        if fenced.decided is not None:
            return kept, ()
        return kept, tuple(m for m in messages if m.id.seq > top)

    @staticmethod
    def _fence_hold(state: _Topic, held: tuple[PubMessage, ...]) -> None:
        """Keep ``held`` (from :meth:`_fence_split`) until the decision."""
        first = held[0].id
        fenced = state.fences[_stream_key(first.source, first.incarnation)]
        for m in held:
            fenced.stash.setdefault(m.id.seq, m)

    def _fence_apply(
        self, state: _Topic, key: StreamKey, value: int, content: tuple[PubMessage, ...]
    ) -> list[Output]:
        """Apply the decision ``value`` on ``key`` (once): take what leads up to
        it, drop what lies beyond, and release what waited beyond it."""
        fenced = state.fences.get(key)
        if fenced is None:
            fenced = state.fences[key] = _Fenced(state.last_rx.get(key, -1), self.id)
        if fenced.decided is not None:
            return []
        fenced.decided = value
        self.fence_decisions += 1
        taken = {m.id.seq: m for m in fenced.stash.values() if m.id.seq <= value}
        taken.update((m.id.seq, m) for m in content if m.id.seq <= value)
        fenced.stash = {}
        fenced.content = tuple(m for m in content if m.id.seq <= value)
        state.fence_asked.pop(key, None)
        out = self._fence_take(state, tuple(taken[s] for s in sorted(taken)))
        src, inc = _stream_of(key)
        out.extend(self._release(state, state.buffer.settle_above(src, inc, value)))
        return out

    def _fence_take(self, state: _Topic, msgs: tuple[PubMessage, ...]) -> list[Output]:
        """Take ``msgs`` (one stream, in order) as a relay of the stream's last round."""
        fresh, last_rx = self._fresh(state.last_rx, msgs)
        if not fresh or last_rx is None:
            return []
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
        if sender == self.id or src == self.id or not FENCE_ASK <= packet.step <= FENCE_DECISION:
            raise RemoteProtocolError(f"malformed FENCE from {sender}: {packet!r}")
        self._check_remote(packet.topic, packet.messages)
        if packet.messages:
            self._fresh({}, packet.messages)  # one stream, in order
            last = packet.messages[-1].id
            if (last.source, last.incarnation) != (src, inc) or last.seq > value:
                raise RemoteProtocolError(f"FENCE from {sender} carries other publications")
        if self._is_dead(sender, packet.round.incarnation):
            return []  # a late word of a dead life: its promise died with it
        state = self._topic(packet.topic)
        key = _stream_key(src, inc)
        step = packet.step
        if step == FENCE_ASK:
            state.fence_asked.setdefault(key, self.id)
            return self._poll_start(state, key)
        if step == FENCE_QUERY:
            step, value, content = self._fence_answer(state, key, sender)
            reply = Fence(self._fence_life(), state.name, MsgId(src, inc, value), step, content)
            return [Send(sender, reply)]
        if step == FENCE_DECISION:
            return self._fence_apply(state, key, value, packet.messages)
        poll = state.polls.get(key)
        if poll is None or poll.waiting.pop(sender, None) is None:
            return []  # decided already, or not asked
        self._poll_note(poll, step, value, packet.messages)
        return self._poll_done(state, key, poll)

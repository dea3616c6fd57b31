"""Resume: a subscriber that was away asks each publisher for what it missed.

A subscriber's frontier (:mod:`p2p.machine._frontier`) says, per topic and
source, the ordinal it delivered last.  When it has fallen behind a source
that is a member (a delivery past the next ordinal, or the source back in
its view after a partition or a restart of either), it sends that source a
:class:`~p2p.wire.Resume` and *holds* the topic: every delivery on it
waits, in arrival order, until each source asked has answered with
:class:`~p2p.wire.Replay` packets from its history
(:mod:`p2p.machine._history`), left the view, or not answered within
:attr:`RecoveryConfig.timeout` twice (asked once more after the first).
The recovered publications and the held ones are then handed on, merged in
causal order (:class:`_Merge`), each through the frontier.

Invariants: a publication reaches the application at most once (the frontier
skips what it has passed); per source, in ordinal order; a recovered
publication before every delivery on its topic that arrived after it was
asked for; what the history no longer holds is counted, exactly, as missed
(the frontier's jump), never skipped silently.  A source answers only
members, at most :data:`ANSWER_BURST` at once and then once per ``spacing``
seconds per asker and topic, with at
most its history; a subscriber takes a replay only from a source it asked,
and holds at most ``max_held`` deliveries (and ``max_held_bytes``) per topic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from causal import MsgId
from p2p.machine._frontier import ENVELOPE_SIZE, GAP, SKIP, Frontier, envelope_of
from p2p.machine._history import Deps, History, HistoryLimits
from p2p.wire import MAX_REPLAY_DEPS, MAX_REPLAY_ENTRIES, Replay, ReplayEntry, Resume
from topics import Delivered, DeliveredRun
from vcube._hot import hot

__all__ = ["HELD", "Recovery", "RecoveryConfig", "Release"]

HELD = -3
""":meth:`Recovery.hand`: the delivery waits (a :class:`Release` hands it on)."""

ANSWER_BURST = 4
"""Answers a source gives one asker on one topic at once (then one per ``spacing``)."""

NAMED_KEPT = 65536
"""Most publications remembered per topic as followed by one handed on."""

REPLAY_BYTES = 256 * 1024
"""Payload bytes past which an answer starts another REPLAY packet."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryConfig:
    """What a node keeps for others and how long it waits for their answers."""

    history: HistoryLimits = field(default_factory=HistoryLimits)
    timeout: float = 5.0
    """Seconds a topic is held for an answer before the silent sources are
    asked once more, and then before the held deliveries go on (what did not
    arrive is then counted as missed)."""
    spacing: float = 1.0
    """Seconds per answer to the same asker on the same topic, past a burst of
    :data:`ANSWER_BURST`."""
    max_held: int = 10_000
    """Most deliveries and replayed publications held per topic; one more
    releases the hold at once."""
    max_held_bytes: int = 16 * 1024 * 1024
    """Most payload bytes held per topic (replays come from the network);
    more releases the hold at once."""
    retries: int = 5
    """Times a source whose answer says it has more (``Replay.more``: rounds
    still on their way that will not bring them here) is asked again, each
    ``spacing`` seconds after its answer; past that, the topic goes on."""

    def __post_init__(self) -> None:
        if (
            not self.timeout > 0
            or self.spacing < 0
            or self.retries < 0
            or min(self.max_held, self.max_held_bytes) < 1
        ):
            raise ValueError(
                "recovery: timeout > 0, spacing >= 0, retries >= 0 and max_held(_bytes) >= 1"
                " required"
            )

    def over(self, held: int, size: int) -> bool:
        """Whether a hold of ``held`` items and ``size`` payload bytes is past the bounds."""
        return held > self.max_held or size > self.max_held_bytes


@hot
class Release:
    """Hand ``delivery`` to the application now, after ``missed`` publications
    of its source it will not get: a publication that was held, or one
    recovered from its source's history (``recovered``)."""

    delivery: Delivered
    missed: int
    recovered: bool = False


@dataclass
class _Hold:
    """A topic waiting for the answers of ``waiting`` (``asked``: every source
    asked during this hold, answered or not); ``queue``: the deliveries that
    arrived meanwhile, ``replays``: the answers so far, per source."""

    waiting: set[int]
    asked: set[int]
    queue: list[Delivered]
    deadline: float
    replays: dict[int, list[tuple[Delivered, Deps]]] = field(default_factory=dict)
    held: int = 0
    """Deliveries and replayed publications held (bounded by ``max_held``)."""
    size: int = 0
    """Their payload bytes (bounded by ``max_held_bytes``)."""
    answered: set[int] = field(default_factory=set)
    parts: dict[int, set[int]] = field(default_factory=dict)
    """Per source asked, the parts of its answer received so far."""
    positions: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Per source asked, the frontier it was asked from (its answer names it)."""
    extended: bool = False
    """The deadline passed once and the silent sources were asked again."""
    again: set[int] = field(default_factory=set)
    """Sources asked a second time: a held delivery showed that their answer
    was made before it and misses some of what came before it (once each)."""
    more: set[int] = field(default_factory=set)
    """Sources whose answer so far says they have more to give (``Replay.more``)."""
    retry_at: dict[int, float] = field(default_factory=dict)
    """Per source that said it has more, when it is asked again."""
    retries: dict[int, int] = field(default_factory=dict)
    """Per source, how many times it was asked again for more."""


class Recovery:
    """One node's side of resume, as publisher and as subscriber (see the
    module docstring).  Its outputs are ``(dest, control)`` pairs to send and
    :class:`Release` items, in order."""

    def __init__(self, node_id: int, frontier: Frontier, config: RecoveryConfig) -> None:
        self.id = node_id
        self.frontier = frontier
        self.config = config
        self.history = History(config.history)
        self._holds: dict[str, _Hold] = {}
        self._deps: dict[str, tuple[int, Deps]] = {}
        """Per topic this node published on, its dependencies as of a count of
        frontier changes (recomputed only after a delivery)."""
        self._named: dict[str, dict[tuple[int, int], int]] = {}
        """Per topic and stream ``(source, incarnation)``, the highest sequence
        number that something handed on directly follows (``Delivered.deps``):
        that publication and, by FIFO, every earlier one of its stream precede
        it, so a copy of one of them from a resume can no longer go on in
        causal order (bounded: :data:`NAMED_KEPT` streams per topic)."""
        self._answered: dict[tuple[int, str], tuple[float, float]] = {}
        """Per asker and topic: answers still allowed, and since when."""
        self.stats = {"resumes_sent": 0, "resumes_answered": 0, "resumes_refused": 0,
                      "recovered": 0, "replays_unasked": 0}  # fmt: skip

    # ------------------------------------------------------ as publisher --

    def kept(self, topic: str, mid: MsgId, payload: bytes, now: float) -> None:
        """This node published ``payload`` on ``topic`` as ``mid``: kept with the
        other sources' publications it delivered last (the first
        :data:`MAX_REPLAY_DEPS` sources it delivered on the topic; the order
        against any further ones is not restored)."""
        if self.history.limits.count == 0:
            return  # nothing kept: no dependencies to gather
        self.history.add(topic, mid, payload, now, self._replay_deps(topic))

    def kept_many(
        self, topic: str, ids: Sequence[MsgId], payloads: Sequence[bytes], now: float
    ) -> None:
        """:meth:`kept` for each of ``payloads``, published in one step as ``ids``
        (nothing delivered between them: they share their dependencies)."""
        if self.history.limits.count == 0:
            return
        self.history.add_many(topic, ids, payloads, now, self._replay_deps(topic))

    def _replay_deps(self, topic: str) -> Deps:
        """What a publication on ``topic`` made now is kept with (:meth:`kept`)."""
        frontier = self.frontier
        cached = self._deps.get(topic)
        if cached is not None and cached[0] == frontier.changes:
            deps = cached[1]  # nothing delivered since the last publication
        else:
            last = frontier.frontiers().get(topic) or {}
            deps = tuple((n, e, o) for n, (e, o) in last.items() if n != self.id)
            deps = deps[:MAX_REPLAY_DEPS]
            self._deps[topic] = (frontier.changes, deps)
        return deps

    def answer(
        self,
        asker: int,
        msg: Resume,
        member: bool,
        now: float,
        unsettled: MsgId | None = None,
        more: bool = False,
    ) -> list[Any]:
        """``asker`` (``member``: in this node's view) asks for what this node
        published on ``msg.topic`` after ``(msg.epoch, msg.ordinal)``: the
        REPLAY packets that answer it, numbered (a subscriber puts them back
        in order whatever order they arrive in).

        Invariant: the answer holds only publications whose rounds completed:
        it stops before ``unsettled``, the first whose round is still on its
        way (``VCubePS.unsettled``).  So a publication the asker gets from the
        history is one every subscriber its round was for has, and if this
        node then crashes nobody is left with one the others can never get.
        What is withheld the asker gets from its round, or, if that round
        will not bring it (``more``: it is not for the asker), by asking
        again (:meth:`replayed`)."""
        if not member or (
            self.history.holds(msg.topic) and not self._may_answer(asker, msg.topic, now)
        ):  # an empty answer costs what the request did: no bucket for it
            self.stats["resumes_refused"] += 1
            return []
        self.stats["resumes_answered"] += 1
        chunks: list[list[ReplayEntry]] = [[]]
        size = 0
        withheld = False
        for kept in self.history.since(msg.topic, msg.epoch, msg.ordinal, now):
            if unsettled is not None and kept.id >= unsettled:
                withheld = True
                break
            chunk = chunks[-1]
            if len(chunk) >= MAX_REPLAY_ENTRIES or size + len(kept.payload) > REPLAY_BYTES:
                chunk = []
                chunks.append(chunk)
                size = 0
            chunk.append((kept.id.incarnation, kept.id.seq, kept.payload, kept.deps))
            size += len(kept.payload)
        after = (msg.topic, msg.epoch, msg.ordinal)
        more = more and withheld
        n = len(chunks)
        return [(asker, Replay(*after, k, n, tuple(c), more)) for k, c in enumerate(chunks)]

    def _may_answer(self, asker: int, topic: str, now: float) -> bool:
        """A token bucket per asker and topic held: :data:`ANSWER_BURST` answers at
        once (a heal can make a subscriber ask twice in a moment), then one
        per ``spacing`` seconds.  The table forgets full buckets when it grows."""
        key = (asker, topic)
        spacing = self.config.spacing
        tokens, since = self._answered.get(key, (ANSWER_BURST, now))
        if spacing > 0:
            tokens = min(ANSWER_BURST, tokens + (now - since) / spacing)
        else:
            tokens = ANSWER_BURST
        if tokens < 1:
            self._answered[key] = (tokens, now)
            return False
        if len(self._answered) >= 4096:  # bounded: drop the buckets that are full again
            self._answered = {
                k: (t, at)
                for k, (t, at) in self._answered.items()
                if spacing > 0 and t + (now - at) / spacing < ANSWER_BURST
            }
            if len(self._answered) >= 4096:  # a flood: start afresh rather than grow
                self._answered.clear()
        self._answered[key] = (tokens - 1, now)
        return True

    # ----------------------------------------------------- as subscriber --

    def followed(self, d: Delivered) -> None:
        """``d`` goes to the application: what it directly follows, and what
        precedes those in their streams, cannot go after it (a resume's copy
        of one of those is not handed on)."""
        if d.deps:
            self._follows(d.topic, d.deps)

    def hand_run(self, run: DeliveredRun) -> bool:
        """:meth:`hand` then :meth:`followed` for each publication of ``run`` in
        one step, where each would be handed on at once with nothing missed
        (no hold on the topic, the frontier's usual case for each); ``False``,
        with nothing changed, otherwise (the caller hands them one by one)."""
        topic, messages = run.topic, run.messages
        if topic in self._holds:
            return False
        if not self.frontier.delivered_run(topic, messages[0].id.source, messages):
            return False
        self._follows(topic, messages[-1].deps)  # the others name earlier ones of its stream
        return True

    def _follows(self, topic: str, deps: Sequence[MsgId]) -> None:
        named = self._named.get(topic)
        if named is None:
            named = self._named[topic] = {}
        for dep in deps:
            stream = (dep.source, dep.incarnation)
            if dep.seq > named.get(stream, -1):
                named[stream] = dep.seq
        while len(named) > NAMED_KEPT:
            del named[next(iter(named))]

    def precedes_handed(self, topic: str, mid: MsgId) -> bool:
        """Whether something already handed on follows ``mid`` (it, or a later
        publication of its stream, was named by a handed delivery)."""
        named = self._named.get(topic)
        return named is not None and mid.seq <= named.get((mid.source, mid.incarnation), -1)

    def hand(self, d: Delivered, member: bool, now: float) -> tuple[int, Sequence[Any]]:
        """A delivery of another node's publication from the core: the count of
        its source's publications missed before it (hand it on now), or
        :data:`SKIP` (not at all) or :data:`HELD` (a :class:`Release` will);
        and the outputs (a RESUME to its source, ``member``: in the view, if
        it is behind)."""
        topic, source = d.topic, d.id.source
        hold = self._holds.get(topic)
        if hold is not None:
            return HELD, self._queue(hold, d, member, now)
        missed = self.frontier.delivered(topic, source, d.payload, hold=member)
        if missed != GAP:
            return missed, ()
        deadline = now + self.config.timeout
        hold = self._holds[topic] = _Hold(set(), set(), [d], deadline, held=1, size=len(d.payload))
        return HELD, self._ask(hold, topic, source)

    def _queue(self, hold: _Hold, d: Delivered, member: bool, now: float) -> list[Any]:
        hold.queue.append(d)
        hold.held += 1
        hold.size += len(d.payload)
        source = d.id.source
        out: list[Any] = []
        if member and source not in hold.asked and self.frontier.behind(d.topic, source, d.payload):
            out = self._ask(hold, d.topic, source)
        if self.config.over(hold.held, hold.size):
            out += self._release(d.topic, now, full=True)
        return out

    def _ask(self, hold: _Hold, topic: str, source: int) -> list[Any]:
        position = self.frontier.position(topic, source)
        if position is None or source in hold.asked:
            return []
        hold.waiting.add(source)
        hold.asked.add(source)
        hold.parts[source] = set()
        hold.positions[source] = position
        self.stats["resumes_sent"] += 1
        return [(source, Resume(topic, *position))]

    def rejoined(self, source: int, topics: set[str], now: float) -> list[Any]:
        """``source`` is (again) in this node's view: ask it for what it published
        on each of ``topics`` after the frontier, holding those topics."""
        out: list[Any] = []
        for topic in sorted(topics):
            if self.frontier.position(topic, source) is None:
                continue
            hold = self._holds.get(topic)
            if hold is None:
                hold = self._holds[topic] = _Hold(set(), set(), [], now + self.config.timeout)
            elif source in hold.asked:
                continue
            out += self._ask(hold, topic, source)
            if not hold.waiting:
                out += self._release(topic, now)
        return out

    def replayed(self, source: int, msg: Replay, now: float) -> list[Any]:
        """Part of ``source``'s answer, kept until the topic goes on: once every
        part came (in any order), if nobody else is awaited (or at once past
        ``max_held``)."""
        hold = self._holds.get(msg.topic)
        got = None if hold is None else hold.parts.get(source)
        if (
            hold is None
            or got is None
            or source not in hold.waiting
            or hold.positions.get(source) != (msg.epoch, msg.ordinal)
            or msg.part in got
        ):  # not an answer to what is asked now (a late one, or a part twice)
            self.stats["replays_unasked"] += 1
            return []
        got.add(msg.part)
        if msg.more:
            hold.more.add(source)
        kept = hold.replays.setdefault(source, [])
        for inc, seq, payload, deps in msg.entries:
            if len(payload) >= ENVELOPE_SIZE:  # no honest member sends less
                kept.append((Delivered(msg.topic, MsgId(source, inc, seq), payload), deps))
        hold.held += len(msg.entries)
        hold.size += sum(len(entry[2]) for entry in msg.entries)
        if len(got) >= msg.parts and not self._ask_more(hold, source, now):
            hold.waiting.discard(source)
            hold.answered.add(source)
        full = self.config.over(hold.held, hold.size)
        if not hold.waiting or full:
            return self._release(msg.topic, now, full=full)
        return []

    def _ask_more(self, hold: _Hold, source: int, now: float) -> bool:
        """``source``'s whole answer came; if it said it has more, and it was
        asked again fewer than ``retries`` times, it is asked again in
        ``spacing`` seconds (it stays awaited): whether it will be."""
        if source not in hold.more or hold.retries.get(source, 0) >= self.config.retries:
            return False
        hold.more.discard(source)
        hold.retries[source] = hold.retries.get(source, 0) + 1
        at = hold.retry_at[source] = now + self.config.spacing
        hold.deadline = max(hold.deadline, at + self.config.timeout)
        return True

    def _asked_again(self, topic: str, hold: _Hold, now: float) -> list[Any]:
        """The sources due to be asked again for more: from after what they gave."""
        out: list[Any] = []
        for source in sorted(s for s, at in hold.retry_at.items() if at <= now):
            del hold.retry_at[source]
            given = [envelope_of(d.payload) for d, _ in hold.replays.get(source, ())]
            position = max([hold.positions[source], *given])
            hold.positions[source] = position
            hold.parts[source] = set()
            self.stats["resumes_sent"] += 1
            out.append((source, Resume(topic, *position)))
        return out

    def gone(self, source: int, now: float) -> list[Any]:
        """``source`` left the view: nobody waits for its answers any more."""
        out: list[Any] = []
        for topic, hold in list(self._holds.items()):
            hold.answered.discard(source)  # not to be asked again
            hold.retry_at.pop(source, None)
            if source in hold.waiting:
                hold.waiting.discard(source)
                if not hold.waiting:
                    out += self._release(topic, now)
        return out

    def forget(self, topic: str) -> None:
        """The application left ``topic``: what was held on it is dropped."""
        self._holds.pop(topic, None)
        self._deps.pop(topic, None)

    @property
    def holding(self) -> bool:
        """Whether a topic waits for an answer."""
        return bool(self._holds)

    def deadline(self) -> float | None:
        """When the oldest hold gives up waiting, or a source is asked again for
        more (``None``: nothing held)."""
        return min(
            (min([h.deadline, *h.retry_at.values()]) for h in self._holds.values()), default=None
        )

    def expire(self, now: float) -> list[Any]:
        """Holds past their deadline: the sources that have not answered (still
        members: one that left was dropped from ``waiting``) are asked once
        more and given another ``timeout`` (a request or its answer can wait
        behind a re-dial); past that, the topic goes on without them."""
        out: list[Any] = []
        for topic, hold in list(self._holds.items()):
            if hold.retry_at:
                out += self._asked_again(topic, hold, now)
            if hold.deadline > now:
                continue
            if hold.extended or not hold.waiting:
                out += self._release(topic, now)
                continue
            hold.extended = True
            hold.deadline = now + self.config.timeout
            for source in sorted(hold.waiting):
                position = hold.positions[source]  # the same request: parts of
                self.stats["resumes_sent"] += 1  # either answer count (the merge drops twins)
                out.append((source, Resume(topic, *position)))
        return out

    def _release(self, topic: str, now: float, *, full: bool = False) -> list[Any]:
        """The topic goes on: the replayed publications and the held deliveries,
        merged by :class:`_Merge`, each through the frontier (what is still
        missing before one is counted).  A held delivery past the next
        ordinal of a source that answered before it arrived stops the merge:
        that source is asked again, once, and the rest waits for it (not
        when the hold overflowed: ``full``)."""
        hold = self._holds.pop(topic)

        def again(d: Delivered) -> bool:
            source = d.id.source
            return (
                not full
                and source in hold.answered
                and source not in hold.again
                and self.frontier.behind(topic, source, d.payload)
            )

        merge = _Merge(self.frontier, topic, hold, self)
        done = merge.run(again)
        self.stats["recovered"] += merge.recovered
        if done:
            return merge.out
        source = merge.queue[0].id.source
        rest = _Hold(set(), set(hold.asked), list(merge.queue), now + self.config.timeout)
        rest.replays = {s: list(items) for s, items in merge.replays.items()}
        rest.held = len(rest.queue) + sum(len(r) for r in rest.replays.values())
        rest.size = sum(len(d.payload) for d in rest.queue) + sum(
            len(d.payload) for items in rest.replays.values() for d, _ in items
        )
        rest.answered = hold.answered - {source}
        rest.again = hold.again | {source}
        rest.retries = dict(hold.retries)
        self._holds[topic] = rest
        rest.asked.discard(source)
        return merge.out + self._ask(rest, topic, source)


class _Merge:
    """One order for a hold's replayed publications and held deliveries.

    Invariant: per source, ordinal order; the held deliveries in the order
    they arrived (the core's causal order); a replayed publication after
    every publication it causally follows (its ``deps``) that is still to
    come here, in a replay or held.  A dependency that is not to come (lost
    from every history) does not hold anything up; if every remaining one
    waits (a cycle through deliveries whose dependencies are unknown), the
    held deliveries go first.
    """

    def __init__(self, frontier: Frontier, topic: str, hold: _Hold, recovery: Recovery) -> None:
        self.frontier = frontier
        self.topic = topic
        self.recovery = recovery
        self.replays = {
            s: deque(sorted(items, key=lambda item: envelope_of(item[0].payload)))
            for s, items in hold.replays.items()
            if items
        }
        self.recovered = 0
        """Replayed publications handed on (not skipped as delivered already)."""
        self.queue = deque(hold.queue)
        self.queued: dict[int, deque[tuple[int, int]]] = {}
        """Per source, the envelopes of its held deliveries, in order."""
        for d in hold.queue:
            self.queued.setdefault(d.id.source, deque()).append(envelope_of(d.payload))
        self.out: list[Any] = []

    def run(self, again: Callable[[Delivered], bool]) -> bool:
        """Hand on everything (True), or stop before a held delivery for which
        ``again`` says its source must be asked again (False: it is
        ``queue[0]``); :attr:`out` has what went on."""
        while self.replays or self.queue:
            if self._ready_replays():
                continue
            if self.queue:
                d = self.queue[0]
                if again(d):
                    return False
                self.queue.popleft()
                self.queued[d.id.source].popleft()
                self._through(d, recovered=False)
                continue
            source = min(self.replays)  # each waits on another: go on with one
            self._pop_replay(source)
        return True

    def _ready_replays(self) -> bool:
        """Hand on every replayed publication whose dependencies are met; whether any was."""
        moved = False
        for source in list(self.replays):
            items = self.replays[source]
            while items and self._met(items[0][1]):
                self._pop_replay(source)
                moved = True
                if source not in self.replays:
                    break
        return moved

    def _pop_replay(self, source: int) -> None:
        items = self.replays[source]
        d, _ = items.popleft()
        if not items:
            del self.replays[source]
        if self.recovery.precedes_handed(self.topic, d.id):
            # Something already handed on follows it: too late for causal
            # order.  Not handed on; the next delivery counts it as missed.
            return
        self._through(d, recovered=True)

    def _met(self, deps: Deps) -> bool:
        """Whether no publication a replayed one follows is still to come here."""
        for source, epoch, ordinal in deps:
            position = self.frontier.position(self.topic, source)
            if position is not None and position >= (epoch, ordinal):
                continue
            first = self._first_to_come(source, position)
            if first is not None and first <= (epoch, ordinal):
                return False
        return True

    def _first_to_come(
        self, source: int, position: tuple[int, int] | None
    ) -> tuple[int, int] | None:
        """The oldest envelope of ``source`` still to be handed on past
        ``position`` (older ones are skipped when their turn comes)."""
        replays = (envelope_of(d.payload) for d, _ in self.replays.get(source, ()))
        firsts = [
            next((e for e in envelopes if position is None or e > position), None)
            for envelopes in (replays, iter(self.queued.get(source, ())))
        ]
        return min((e for e in firsts if e is not None), default=None)

    def _through(self, d: Delivered, *, recovered: bool) -> None:
        missed = self.frontier.delivered(self.topic, d.id.source, d.payload)
        if missed != SKIP:
            self.recovered += recovered
            self.recovery.followed(d)
            self.out.append(Release(d, missed, recovered))

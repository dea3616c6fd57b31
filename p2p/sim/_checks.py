"""Trace invariants of causal topic pub/sub, checkable on any recorded run.

The input is a sequence of :class:`~p2p.sim.TraceEvent` (``subscribe``,
``subscribed``, ``unsubscribe``, ``publish``, ``deliver``) in which the events
of each node appear in that node's processing order.  Events of different
nodes may interleave arbitrarily (the simulator's trace is globally ordered,
traces gathered from real nodes are merely concatenated per node): the
checker merges them itself, delaying a node's ``deliver`` until the matching
``publish`` has been seen, so the happened-before relation it computes never
depends on clocks.

Safety (checked on every prefix of a run):

``duplicate``
    a node delivers each ``(source, seq)`` at most once;
``invented``
    every delivered ``(source, seq)`` was published by ``source``, on the
    topic it is delivered on;
``unsubscribed``
    a node delivers (or publishes) on ``t`` only between its ``subscribe`` and
    its next ``unsubscribe`` of ``t`` (a publisher's delivery of its own
    publication is a delivery like any other);
``fifo``
    at every node, deliveries from one source incarnation on one topic have
    increasing ``seq`` (a restarted source is a new one: it knows nothing of
    its previous life, whose last publications may still arrive after its
    new ones);
``causal``
    per topic, if ``m1`` happened before ``m2`` (the publisher of ``m2``
    published or delivered ``m1``, or something ``m1`` happened before, earlier
    than ``m2``) no node delivers ``m2`` and later ``m1``;
``inert``
    a crashed node does nothing until it recovers: no delivery, publication
    or subscription between its ``crash`` and its ``recover``, and no event of
    it stamped later than an event that follows it (a node's events are in
    its processing order, so a ``crash`` stamped before an earlier-listed
    delivery means the node delivered after crashing);
``malformed``
    the trace itself is inconsistent (subscribe twice, a ``subscribed``
    without a pending subscription, a publication id used twice...).

Liveness (only with ``quiescent=True``, when the run is over):

``liveness``
    a node whose subscription to ``t`` was confirmed (``subscribed``) before a
    publication ``m`` on ``t`` and that is still subscribed at the end
    delivered ``m``, if ``m`` is *required*: its publisher did not crash
    after publishing it (validity), or a node that is up at the end delivered
    it (agreement).  With partial membership (a ``publish`` line that carries
    the publisher's ``view``) ``m`` is owed only to the subscribers in it: a
    node cannot send to a subscriber it has not heard of yet, and the views
    are checked to converge instead (``check_views``);
``own``
    every publisher that is up at the end delivered its own publications.

Failures: ``crash`` ends every subscription of its node (a crashed node is
not correct, so nothing is required of it); ``recover`` starts the node
afresh, as a new incarnation with no subscription and nothing delivered.

How ``causal`` stays cheap: the causal past of a publication ``m`` on topic
``t`` is closed under "earlier publication of the same source incarnation on
``t``" (the source published those before ``m``), so it is exactly described
by a frontier ``{(source, life): highest seq in the past}``, and ``m1 -> m2``
iff ``m1.seq <= past(m2)[(m1.source, m1.life)]`` (per incarnation: a
restarted source's new publications follow its old ones only if it delivered
them).  Each node keeps the frontier of what it has
published or delivered on each topic; a publication snapshots its publisher's
frontier; a delivery of ``m`` merges ``past(m)`` and ``m`` in (skipped when the
node already knows ``m`` or a later publication of its source, whose past
contains ``past(m)``).  So a node's frontier is its own publications plus
everything it delivered and their pasts, and delivering ``m1`` from another
source violates causal order iff the frontier already covers ``m1`` (it is
not a duplicate, so it is in the past of something delivered or published
here, and what this node published is in turn in the past of what it
delivered).  A node's own publication is delivered at once; it is checked
against what the node delivered between publishing and delivering it.
Cost: one frontier merge per delivery, ``O(deliveries x sources per topic)``.

One checker, one file past the usual 600 lines: every invariant is checked
in the same merged pass over the trace, on the state that pass keeps.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from p2p.sim._recorder import TraceEvent
from topics import VCubePS

if TYPE_CHECKING:
    from p2p.sim._engine import Simulation

Stream = tuple[int, int]
"""``(source, life)``: one incarnation of a source; its seqs are in causal order."""
Frontier = dict[Stream, int]
"""``{source: highest seq}`` of a downward-closed set of publications of one topic."""

PubKey = tuple[str, int, int]
"""``(topic, source, seq)``."""

KINDS = (
    "duplicate",
    "invented",
    "unsubscribed",
    "fifo",
    "causal",
    "inert",
    "malformed",
    "liveness",
    "own",
    "view",
    "not-quiescent",
)
"""Every :attr:`Violation.kind` this module reports."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: its ``kind`` (see :data:`KINDS`), where, and what happened."""

    kind: str
    node: int
    topic: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] node {self.node} topic {self.topic!r}: {self.detail}"


@dataclass(slots=True)
class _Publication:
    time: float
    publisher: int
    past: Frontier
    life: int = 0
    """The publisher's incarnation count when it published (see ``_Node.life``)."""
    view: frozenset[int] | None = None
    """The subscribers the publisher knew of, if the trace says (partial membership)."""


@dataclass(slots=True)
class _Period:
    """One subscription of one node to one topic."""

    confirmed: float | None = None
    ended: bool = False


@dataclass(slots=True)
class _Node:
    """What the checker tracks per node."""

    subscribed: set[str] = field(default_factory=set)
    delivered: set[tuple[int, int]] = field(default_factory=set)
    delivered_on: dict[str, set[tuple[int, int]]] = field(default_factory=lambda: defaultdict(set))
    last_seq: dict[tuple[str, Stream], int] = field(default_factory=dict)
    known: dict[str, Frontier] = field(default_factory=dict)
    cause: dict[str, dict[Stream, tuple[int, int]]] = field(default_factory=dict)
    """Per topic and frontier entry: the publication delivered (or published) here
    that brought the entry in, to name it in a ``causal`` report."""
    own_pending: dict[str, dict[int, bool]] = field(default_factory=dict)
    """Own publications not yet delivered: ``seq -> preceded by a delivery already``."""
    periods: dict[str, list[_Period]] = field(default_factory=dict)
    queue: deque[TraceEvent] = field(default_factory=deque)
    life: int = 0
    """How many times the node recovered; a life that crashed is in ``crashed``."""
    crashed: set[int] = field(default_factory=set)
    up: bool = True
    crashed_at: float = 0.0
    last_time: float = float("-inf")
    """Time of the node's latest processed event (events come in its processing order)."""

    def crash(self) -> None:
        """End every subscription: a crashed node owes nothing any more."""
        for periods in self.periods.values():
            periods[-1].ended = True
        self.subscribed.clear()
        self.crashed.add(self.life)
        self.up = False

    def recover(self) -> None:
        """A new incarnation: nothing subscribed, delivered or known."""
        self.delivered, self.delivered_on = set(), defaultdict(set)
        self.last_seq, self.known, self.own_pending, self.cause = {}, {}, {}, {}
        self.life += 1
        self.up = True


def _what(ev: TraceEvent) -> str:
    """The event's message id, or its topic when it has none."""
    if ev.event in ("deliver", "publish"):
        return f"({ev.source}, {ev.seq}) on {ev.topic!r}"
    return repr(ev.topic) if ev.topic else ""


def _covers(frontier: Frontier | None, source: Stream, seq: int) -> bool:
    return frontier is not None and frontier.get(source, -1) >= seq


def _merge(
    into: Frontier, other: Frontier, cause: dict[Stream, tuple[int, int]], by: tuple[int, int]
) -> None:
    """Raise ``into`` to cover ``other``; entries raised are caused ``by``."""
    for src, seq in other.items():
        if into.get(src, -1) < seq:
            into[src] = seq
            cause[src] = by


class TraceChecker:
    """Incremental checker: :meth:`feed` events as they happen, ask :meth:`violations`.

    Feeding a growing trace piece by piece gives the same result as feeding it
    at once, so a property test can check every step in time proportional to
    the new events only.
    """

    def __init__(self) -> None:
        self._nodes: dict[int, _Node] = {}
        self._pubs: dict[PubKey, _Publication] = {}
        self._pub_topic: dict[tuple[int, int], str] = {}
        self._blocked: dict[tuple[int, int], list[int]] = {}
        self._found: list[Violation] = []
        self._gaps: Counter[tuple[int, str, int]] = Counter()
        """Publications reported missed, per (node, topic, source) (``gap`` events)."""
        self._got: Counter[tuple[int, str, int]] = Counter()
        """Deliveries per (node, topic, source), over all of the node's lives."""
        self.events = 0
        """Events processed so far (excluding those waiting for their publication)."""

    def __repr__(self) -> str:
        return (
            f"TraceChecker(events={self.events}, publications={len(self._pubs)}, "
            f"violations={len(self._found)})"
        )

    # ------------------------------------------------------------------ input

    def feed(self, events: Iterable[TraceEvent]) -> None:
        """Process ``events`` (per node in processing order, nodes interleaved freely)."""
        for ev in events:
            node = self._node(ev.node)
            node.queue.append(ev)
            if len(node.queue) == 1:
                self._drain(ev.node)

    def _node(self, n: int) -> _Node:
        state = self._nodes.get(n)
        if state is None:
            state = self._nodes[n] = _Node()
        return state

    def _drain(self, start: int) -> None:
        """Process queued events of ``start`` and of every node a publication unblocks."""
        ready = [start]
        while ready:
            n = ready.pop()
            queue = self._nodes[n].queue
            while queue:
                ev = queue[0]
                if ev.event == "deliver" and self._waits(ev):
                    assert ev.source is not None
                    assert ev.seq is not None
                    self._blocked.setdefault((ev.source, ev.seq), []).append(n)
                    break
                queue.popleft()
                ready.extend(self._process(ev))

    def _waits(self, ev: TraceEvent) -> bool:
        """Whether a delivery must wait for its publication to be fed."""
        if ev.source is None or ev.seq is None:
            return False
        return (ev.source, ev.seq) not in self._pub_topic

    def _process(self, ev: TraceEvent) -> list[int]:
        """Apply one event; return the nodes it unblocks."""
        self.events += 1
        kind = ev.event
        if not self._check_inert(ev):
            return []
        if kind == "deliver":
            self._on_deliver(ev)
            if ev.source is not None:
                self._got[(ev.node, ev.topic, ev.source)] += 1
        elif kind == "gap":
            self._on_gap(ev)
        elif kind == "publish":
            return self._on_publish(ev)
        elif kind == "subscribe":
            self._on_subscribe(ev)
        elif kind == "subscribed":
            self._on_subscribed(ev)
        elif kind == "unsubscribe":
            self._on_unsubscribe(ev)
        elif kind in ("crash", "recover"):
            self._on_failure(ev)
        else:
            self._report("malformed", ev, f"unknown event {kind!r}")
        return []

    def _on_gap(self, ev: TraceEvent) -> None:
        """A reported loss: ``seq`` is the count of publications of ``source``
        the node says it will not get (checked against what was published in
        :meth:`_invented_gaps`)."""
        if ev.source is None or ev.seq is None or ev.seq <= 0:
            self._report("malformed", ev, "a gap names its source and a positive count")
            return
        self._gaps[(ev.node, ev.topic, ev.source)] += ev.seq

    def _invented_gaps(self) -> list[Violation]:
        """A node that reports more publications of a source missed than the
        source made, less those the node delivered, invented a loss."""
        made: Counter[tuple[str, int]] = Counter((t, src) for t, src, _ in self._pubs)
        out = []
        for (n, topic, src), count in sorted(self._gaps.items()):
            room = made[(topic, src)] - self._got[(n, topic, src)]
            if count > room:
                why = f"reported {count} publications of {src} missed, only {room} not delivered"
                out.append(Violation("gap", n, topic, why))
        return out

    def close(self) -> None:
        """Declare the trace complete: deliveries still waiting count as ``invented``.

        Each such delivery is reported and skipped, and the events queued
        behind it at its node are then checked normally.
        """
        while True:
            stuck = [n for n, node in sorted(self._nodes.items()) if node.queue]
            if not stuck:
                return
            n = stuck[0]
            ev = self._nodes[n].queue.popleft()
            self.events += 1
            self._report("invented", ev, f"delivered ({ev.source}, {ev.seq}), never published")
            self._drain(n)

    def _check_inert(self, ev: TraceEvent) -> bool:
        """Report an event of a crashed node, or one stamped before its node's
        previous event; ``False`` if ``ev`` must be skipped (the node is down)."""
        node = self._node(ev.node)
        if ev.time < node.last_time:
            what = "crashed" if ev.event == "crash" else f"{ev.event} {_what(ev)}"
            self._report(
                "inert",
                ev,
                f"{what} stamped before its previous event at t={node.last_time}"
                + (" (it acted after crashing)" if ev.event == "crash" else ""),
            )
        node.last_time = max(node.last_time, ev.time)
        if node.up or ev.event in ("crash", "recover"):
            return True
        self._report(
            "inert", ev, f"{ev.event} {_what(ev)} while crashed (since t={node.crashed_at})"
        )
        return False

    def _report(self, kind: str, ev: TraceEvent, detail: str) -> None:
        self._found.append(Violation(kind, ev.node, ev.topic, f"{detail} (at t={ev.time})"))

    # ------------------------------------------------------------ membership

    def _on_subscribe(self, ev: TraceEvent) -> None:
        node = self._node(ev.node)
        if ev.topic in node.subscribed:
            self._report("malformed", ev, "subscribe while already subscribed")
        node.subscribed.add(ev.topic)
        node.periods.setdefault(ev.topic, []).append(_Period())

    def _on_subscribed(self, ev: TraceEvent) -> None:
        node = self._node(ev.node)
        periods = node.periods.get(ev.topic)
        if ev.topic not in node.subscribed or not periods:
            self._report("malformed", ev, "subscribed without a pending subscribe")
            return
        if periods[-1].confirmed is not None:
            self._report("malformed", ev, "subscription confirmed twice")
            return
        periods[-1].confirmed = ev.time

    def _on_unsubscribe(self, ev: TraceEvent) -> None:
        node = self._node(ev.node)
        if ev.topic not in node.subscribed:
            self._report("malformed", ev, "unsubscribe while not subscribed")
            return
        node.subscribed.discard(ev.topic)
        node.periods[ev.topic][-1].ended = True

    def _on_failure(self, ev: TraceEvent) -> None:
        node = self._node(ev.node)
        crash = ev.event == "crash"
        if node.up != crash:
            self._report("malformed", ev, f"{ev.event} of a node that is already so")
        elif crash:
            node.crash()
            node.crashed_at = ev.time
        else:
            node.recover()

    # ---------------------------------------------------------- publications

    def _on_publish(self, ev: TraceEvent) -> list[int]:
        node = self._node(ev.node)
        if ev.seq is None or ev.source != ev.node:
            self._report("malformed", ev, f"publish with source={ev.source} seq={ev.seq}")
            return []
        if ev.topic not in node.subscribed:
            self._report("unsubscribed", ev, f"published ({ev.source}, {ev.seq}) unsubscribed")
        key = (ev.topic, ev.source, ev.seq)
        if (ev.source, ev.seq) in self._pub_topic:
            self._report("malformed", ev, f"publication id ({ev.source}, {ev.seq}) reused")
            return []
        known = node.known.setdefault(ev.topic, {})
        view = None if ev.view is None else frozenset(ev.view)
        self._pubs[key] = _Publication(ev.time, ev.node, dict(known), node.life, view)
        self._pub_topic[(ev.source, ev.seq)] = ev.topic
        known[(ev.source, node.life)] = ev.seq
        node.cause.setdefault(ev.topic, {})[(ev.source, node.life)] = (ev.source, ev.seq)
        node.own_pending.setdefault(ev.topic, {})[ev.seq] = False
        return self._blocked.pop((ev.source, ev.seq), [])

    def _on_deliver(self, ev: TraceEvent) -> None:
        node = self._node(ev.node)
        if ev.source is None or ev.seq is None:
            self._report("invented", ev, f"delivered an unknown id source={ev.source} seq={ev.seq}")
            return
        src, seq, topic = ev.source, ev.seq, ev.topic
        what = f"({src}, {seq})"
        pub = self._pubs.get((topic, src, seq))
        if pub is None:
            other = self._pub_topic.get((src, seq))
            self._report("invented", ev, f"delivered {what}, published on {other!r}")
            return
        if (src, seq) in node.delivered:
            self._report("duplicate", ev, f"delivered {what} again")
            return
        node.delivered.add((src, seq))
        node.delivered_on[topic].add((src, seq))
        if topic not in node.subscribed:
            self._report("unsubscribed", ev, f"delivered {what} while not subscribed")
        stream = (src, pub.life)
        last = node.last_seq.get((topic, stream))
        if last is not None and seq < last:
            self._report("fifo", ev, f"delivered {what} after ({src}, {last})")
        node.last_seq[(topic, stream)] = max(seq, last if last is not None else seq)
        known = node.known.setdefault(topic, {})
        cause = node.cause.setdefault(topic, {})
        if self._precedes_delivered(node, ev, pub, known):
            self._report("causal", ev, f"delivered {what} {self._late(node, ev, cause, stream)}")
        if not _covers(known, stream, seq):
            _merge(known, pub.past, cause, (src, seq))
            known[stream] = seq
            cause[stream] = (src, seq)

    @staticmethod
    def _late(
        node: _Node, ev: TraceEvent, cause: dict[Stream, tuple[int, int]], stream: Stream
    ) -> str:
        """Why a delivery is too late: the publication here whose past holds it."""
        by = cause.get(stream)
        if by is None or by[0] == ev.source:
            return "after its own publication that follows it (it waited for nothing)"
        mine = "published" if by[0] == ev.node else "delivered"
        return (
            f"after it {mine} {by}, which causally follows it: "
            f"{by} should have waited for ({ev.source}, {ev.seq})"
        )

    @staticmethod
    def _precedes_delivered(
        node: _Node, ev: TraceEvent, pub: _Publication, known: Frontier
    ) -> bool:
        """Whether ``ev``'s publication precedes one ``node`` delivered already."""
        assert ev.source is not None
        assert ev.seq is not None
        pending = node.own_pending.get(ev.topic)
        if pending:
            # Own publications awaiting delivery that this one follows are late now.
            for seq in pending:
                if seq != ev.seq and (
                    pub.past.get((ev.node, node.life), -1) >= seq
                    or (ev.source == ev.node and seq < ev.seq)
                ):
                    pending[seq] = True
        if ev.source == ev.node and pending is not None and ev.seq in pending:
            return pending.pop(ev.seq)
        return _covers(known, (ev.source, pub.life), ev.seq)

    # ---------------------------------------------------------------- output

    def violations(self, *, quiescent: bool = False) -> list[Violation]:
        """Everything violated by the events fed so far.

        Deliveries still waiting for a publication that was not fed (yet) count
        as ``invented``.  With ``quiescent=True`` the run is taken to be over and
        the liveness checks run too.
        """
        found = list(self._found)
        found.extend(self._unresolved())
        found.extend(self._invented_gaps())
        if quiescent:
            found.extend(self._liveness())
        return found

    def _unresolved(self) -> list[Violation]:
        out = []
        for n, node in sorted(self._nodes.items()):
            if node.queue:
                ev = node.queue[0]
                why = f"delivered ({ev.source}, {ev.seq}), not published (yet)"
                out.append(Violation("invented", n, ev.topic, f"{why} (at t={ev.time})"))
        return out

    def _liveness(self) -> list[Violation]:
        out: list[Violation] = []
        by_topic: dict[str, list[tuple[float, int, int, int, frozenset[int] | None]]]
        by_topic = defaultdict(list)
        held_by_up: dict[str, set[tuple[int, int]]] = defaultdict(set)
        for node in self._nodes.values():
            if node.up:
                for topic, got in node.delivered_on.items():
                    held_by_up[topic] |= got
        for (topic, src, seq), pub in self._pubs.items():
            publisher = self._nodes[pub.publisher]
            if pub.life in publisher.crashed and (src, seq) not in held_by_up[topic]:
                continue  # died with its publisher and no correct node has it
            by_topic[topic].append((pub.time, src, seq, pub.publisher, pub.view))
            if pub.life == publisher.life and (src, seq) not in publisher.delivered_on[topic]:
                out.append(
                    Violation("own", pub.publisher, topic, f"did not deliver own ({src}, {seq})")
                )
        for pubs in by_topic.values():
            pubs.sort(key=lambda p: p[:4])
        for n, node in sorted(self._nodes.items()):
            for topic, periods in sorted(node.periods.items()):
                cur = periods[-1]
                if cur.ended or cur.confirmed is None:
                    continue
                got = node.delivered_on[topic]
                missing = [
                    (src, seq)
                    for time, src, seq, publisher, view in by_topic.get(topic, ())
                    if time > cur.confirmed
                    and publisher != n
                    and (view is None or n in view)
                    and (src, seq) not in got
                ]
                if missing:
                    shown = ", ".join(map(str, missing[:8]))
                    more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
                    out.append(
                        Violation(
                            "liveness",
                            n,
                            topic,
                            f"subscribed since t={cur.confirmed}, never delivered {shown}{more}",
                        )
                    )
        return out


def check_trace(trace: Iterable[TraceEvent], *, quiescent: bool = False) -> list[Violation]:
    """Every invariant ``trace`` breaks (empty when all hold); see the module docstring."""
    checker = TraceChecker()
    checker.feed(trace)
    checker.close()
    return checker.violations(quiescent=quiescent)


def format_violations(violations: Sequence[Violation], *, limit: int = 20) -> str:
    """A readable multi-line report, grouped by kind."""
    if not violations:
        return "no violations"
    counts: dict[str, int] = defaultdict(int)
    for v in violations:
        counts[v.kind] += 1
    head = ", ".join(f"{k}: {c}" for k, c in sorted(counts.items()))
    lines = [f"{len(violations)} violation(s) ({head})"]
    ordered = sorted(violations, key=lambda v: KINDS.index(v.kind) if v.kind in KINDS else 99)
    lines.extend(f"  {v}" for v in ordered[:limit])
    if len(violations) > limit:
        lines.append(f"  ... {len(violations) - limit} more")
    return "\n".join(lines)


def assert_no_violations(violations: Sequence[Violation], context: str = "") -> None:
    """Raise :class:`AssertionError` with a readable report if ``violations`` is non-empty."""
    if violations:
        prefix = f"{context}: " if context else ""
        raise AssertionError(prefix + format_violations(violations))


def assert_trace(trace: Iterable[TraceEvent], *, quiescent: bool = False) -> None:
    """:func:`check_trace`, raising :class:`AssertionError` with a report on violations."""
    assert_no_violations(check_trace(trace, quiescent=quiescent), "trace invariants")


def check_views(sim: Simulation, topics: Iterable[str] | None = None) -> list[Violation]:
    """After quiescence: every confirmed subscriber's view is the true subscriber set.

    Crashed or revoked nodes are neither checked nor expected in any view.

    For every VCube-PS node that is a confirmed subscriber of a topic,
    ``core.view(topic)`` (the membership gathered by SUB ACK waves and
    UNS rounds) must equal ``{n : sim.nodes[n].is_subscribed(topic)}``.
    Only subscribers are checked: a non-subscriber's directory is not kept up
    to date (UNS rounds only reach subscribers), by design.  ``topics``
    defaults to every topic subscribed in the recorded trace.  Nodes are
    reported by trace index; the detail names ids.
    """
    out: list[Violation] = []
    if not sim.quiescent():
        out.append(Violation("not-quiescent", -1, "", "views checked before quiescence"))
    if topics is None:
        if not sim.recorder.record_trace:
            raise ValueError("check_views needs topics= when the trace is not recorded")
        topics = {ev.topic for ev in sim.recorder.trace if ev.event == "subscribe"}
    for topic in sorted(set(topics)):
        gone = sim.out
        up = {n: core for n, core in sim.nodes.items() if n not in gone}
        truth = frozenset(n for n, core in up.items() if core.is_subscribed(topic))
        for n, core in up.items():
            if not isinstance(core, VCubePS) or not core.is_confirmed(topic):
                continue
            view = core.view(topic)
            if view != truth:
                out.append(
                    Violation(
                        "view",
                        sim.index[n],
                        topic,
                        f"node id {n} sees {sorted(view)}; subscribed: {sorted(truth)} "
                        f"(missing {sorted(truth - view)}, stale {sorted(view - truth)})",
                    )
                )
    return out


def assert_views(sim: Simulation, topics: Iterable[str] | None = None) -> None:
    """:func:`check_views`, raising :class:`AssertionError` with a report on violations."""
    assert_no_violations(check_views(sim, topics), "views")


__all__ = [
    "KINDS",
    "TraceChecker",
    "Violation",
    "assert_no_violations",
    "assert_trace",
    "assert_views",
    "check_trace",
    "check_views",
    "format_violations",
]

"""The trace checker of :mod:`p2p.sim._checks` on hand-made traces.

Every invariant is shown to hold on a good trace and to fail on a trace
crafted to break it, so a checker that accepts everything fails here.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2p.sim import (
    Simulation,
    TraceChecker,
    TraceEvent,
    Violation,
    assert_no_violations,
    assert_trace,
    assert_views,
    check_trace,
    check_views,
    format_violations,
)

T = "t"


class Trace:
    """Builds a trace; time advances by one per event unless given."""

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []
        self.clock = 0.0

    def _add(self, node: int, event: str, topic: str, source: int | None, seq: int | None) -> None:
        self.clock += 1.0
        self.events.append(TraceEvent(self.clock, node, event, topic, source, seq))

    def sub(self, node: int, topic: str = T, *, confirm: bool = True) -> Trace:
        self._add(node, "subscribe", topic, node, None)
        if confirm:
            self._add(node, "subscribed", topic, node, None)
        return self

    def confirm(self, node: int, topic: str = T) -> Trace:
        self._add(node, "subscribed", topic, node, None)
        return self

    def uns(self, node: int, topic: str = T) -> Trace:
        self._add(node, "unsubscribe", topic, node, None)
        return self

    def pub(self, node: int, seq: int, topic: str = T, *, own: bool = True) -> Trace:
        self._add(node, "publish", topic, node, seq)
        if own:
            self.dlv(node, node, seq, topic)
        return self

    def dlv(self, node: int, source: int | None, seq: int | None, topic: str = T) -> Trace:
        self._add(node, "deliver", topic, source, seq)
        return self


def kinds(violations: Iterable[Violation]) -> list[str]:
    return sorted(v.kind for v in violations)


def base() -> Trace:
    """Three confirmed subscribers of ``t``."""
    return Trace().sub(0).sub(1).sub(2)


def chain() -> Trace:
    """0 publishes m1=(0,5); 1 delivers it and publishes m2=(1,7): m1 -> m2."""
    return base().pub(0, 5).dlv(1, 0, 5).pub(1, 7).dlv(0, 1, 7)


# ------------------------------------------------------------- good traces


def test_good_trace_has_no_violations() -> None:
    tr = chain().dlv(2, 0, 5).dlv(2, 1, 7)
    assert check_trace(tr.events) == []
    assert check_trace(tr.events, quiescent=True) == []
    assert_trace(tr.events, quiescent=True)


def test_empty_trace_is_fine() -> None:
    assert check_trace([], quiescent=True) == []
    assert format_violations([]) == "no violations"


def test_concurrent_publications_may_arrive_in_any_order() -> None:
    tr = base().pub(0, 1).pub(1, 1).dlv(2, 1, 1).dlv(2, 0, 1).dlv(0, 1, 1).dlv(1, 0, 1)
    assert check_trace(tr.events, quiescent=True) == []


def test_late_joiner_may_skip_the_causal_past() -> None:
    """A node subscribed after m1 never delivers it: fine for safety and liveness."""
    tr = Trace().sub(0).sub(1).pub(0, 5).dlv(1, 0, 5).pub(1, 7).dlv(0, 1, 7)
    tr.sub(2).dlv(2, 1, 7)
    assert check_trace(tr.events, quiescent=True) == []


def test_topics_are_independent() -> None:
    """Causality and FIFO are per topic: the same source interleaves topics freely."""
    tr = Trace().sub(0, "a").sub(0, "b").sub(1, "a").sub(1, "b")
    tr.pub(0, 1, "a").pub(0, 2, "b").dlv(1, 0, 2, "b").dlv(1, 0, 1, "a")
    assert check_trace(tr.events, quiescent=True) == []


# ------------------------------------------------------------ 1 duplicates


def test_duplicate_delivery() -> None:
    tr = chain().dlv(2, 0, 5).dlv(2, 0, 5)
    (v,) = check_trace(tr.events)
    assert v.kind == "duplicate"
    assert v.node == 2
    assert "(0, 5)" in v.detail


def test_duplicate_of_own_publication() -> None:
    tr = base().pub(0, 1).dlv(0, 0, 1)
    assert kinds(check_trace(tr.events)) == ["duplicate"]


# ------------------------------------------------------------- 2 invention


def test_delivery_of_something_never_published() -> None:
    tr = base().dlv(1, 0, 3)
    (v,) = check_trace(tr.events)
    assert v.kind == "invented"
    assert v.node == 1


def test_delivery_on_another_topic_than_published() -> None:
    tr = base().sub(1, "u").pub(0, 3).dlv(1, 0, 3, "u")
    (v,) = check_trace(tr.events)
    assert v.kind == "invented"
    assert v.topic == "u"
    assert "'t'" in v.detail


def test_delivery_of_an_unknown_source() -> None:
    tr = base().dlv(1, None, None)
    assert kinds(check_trace(tr.events)) == ["invented"]


def test_invented_delivery_does_not_hide_the_rest_of_the_node() -> None:
    tr = base().pub(0, 1).dlv(1, 0, 9).dlv(1, 0, 1).dlv(1, 0, 1)
    assert kinds(check_trace(tr.events)) == ["duplicate", "invented"]


def test_incremental_checker_waits_for_the_publication() -> None:
    """Fed per node, a delivery seen before its publish is held, not reported, once
    the publish arrives."""
    tr = base().pub(0, 1).dlv(1, 0, 1).dlv(2, 0, 1)
    pub_events = [e for e in tr.events if e.node == 0]
    other = [e for e in tr.events if e.node != 0]
    checker = TraceChecker()
    checker.feed(other)
    assert kinds(checker.violations()) == ["invented", "invented"]  # not published (yet)
    checker.feed(pub_events)
    assert checker.violations(quiescent=True) == []


# --------------------------------------------------- 3 while unsubscribed


def test_delivery_before_subscribing() -> None:
    tr = Trace().sub(0).pub(0, 1).dlv(1, 0, 1)
    (v,) = check_trace(tr.events)
    assert (v.kind, v.node) == ("unsubscribed", 1)


def test_delivery_after_unsubscribing() -> None:
    tr = base().pub(0, 1).uns(2).dlv(1, 0, 1).dlv(2, 0, 1)
    (v,) = check_trace(tr.events)
    assert (v.kind, v.node) == ("unsubscribed", 2)


def test_delivery_after_resubscribing_is_fine() -> None:
    tr = base().uns(2).sub(2).pub(0, 1).dlv(1, 0, 1).dlv(2, 0, 1)
    assert check_trace(tr.events, quiescent=True) == []


def test_delivery_before_confirmation_is_allowed() -> None:
    tr = base().sub(3, confirm=False).pub(0, 1).dlv(3, 0, 1)
    assert check_trace(tr.events) == []


def test_publish_while_unsubscribed() -> None:
    tr = base().uns(0).pub(0, 1)
    assert kinds(check_trace(tr.events)) == ["unsubscribed", "unsubscribed"]


# ------------------------------------------------------------------ 4 FIFO


def test_fifo_violation() -> None:
    tr = base().pub(0, 1).pub(0, 4).dlv(1, 0, 4).dlv(1, 0, 1)
    found = check_trace(tr.events)
    assert "fifo" in kinds(found)
    fifo = next(v for v in found if v.kind == "fifo")
    assert fifo.node == 1
    assert "(0, 1) after (0, 4)" in fifo.detail


def test_fifo_with_gaps_is_fine() -> None:
    """Per-source seqs are shared across topics: gaps are normal."""
    tr = base().pub(0, 1).pub(0, 9).dlv(1, 0, 9)
    assert check_trace(tr.events) == []


def _restart(tr: Trace, node: int) -> Trace:
    """``node`` crashes and comes back as a new incarnation, subscribed again."""
    tr._add(node, "crash", "", None, None)
    tr._add(node, "recover", "", None, None)
    return tr.sub(node)


def test_a_restarted_source_is_a_new_stream_for_fifo_and_causality() -> None:
    """Its new publication may be delivered before its old one (relayed late):
    the new life knows nothing of the old one, so neither order is owed."""
    tr = _restart(base().pub(0, 1), 0).pub(0, 3).dlv(1, 0, 3).dlv(1, 0, 1)
    assert check_trace(tr.events) == []


def test_a_restarted_source_that_delivered_its_old_publication_follows_it() -> None:
    """Unless the new life delivered the old publication before publishing."""
    tr = _restart(base().pub(0, 1), 0).dlv(0, 0, 1).pub(0, 3).dlv(1, 0, 3).dlv(1, 0, 1)
    assert kinds(check_trace(tr.events)) == ["causal"]


# ------------------------------------------------------------ 5 causality


def test_causal_violation_direct() -> None:
    tr = chain().dlv(2, 1, 7).dlv(2, 0, 5)
    (v,) = check_trace(tr.events)
    assert (v.kind, v.node) == ("causal", 2)
    assert "(0, 5)" in v.detail


def test_causal_violation_transitive() -> None:
    """m1 -> m2 -> m3 with m3 published by a node that never delivered m1."""
    tr = Trace().sub(0).sub(1).sub(2).sub(3)
    tr.pub(0, 1).dlv(1, 0, 1).pub(1, 2).dlv(2, 1, 2).pub(2, 3)
    tr.dlv(3, 2, 3).dlv(3, 0, 1)
    (v,) = check_trace(tr.events)
    assert (v.kind, v.node) == ("causal", 3)


def test_causal_through_own_earlier_publication() -> None:
    """Publishing twice: the second follows the first even with nothing in between."""
    tr = Trace().sub(0).sub(1).sub(2)
    tr.pub(0, 1).dlv(1, 0, 1).pub(1, 2).pub(1, 3)
    tr.dlv(2, 1, 3).dlv(2, 0, 1)
    assert kinds(check_trace(tr.events)) == ["causal"]


def test_delivering_after_publishing_is_not_a_causal_dependency() -> None:
    """1 publishes m2, then delivers m1: m1 does not precede m2."""
    tr = base().pub(0, 5).pub(1, 7).dlv(1, 0, 5).dlv(2, 1, 7).dlv(2, 0, 5)
    assert check_trace(tr.events) == []


def test_own_publication_delivered_late_after_a_successor() -> None:
    """0 publishes m1 but delivers it only after delivering m2, which follows m1."""
    tr = base().pub(0, 5, own=False).dlv(1, 0, 5).pub(1, 7).dlv(0, 1, 7).dlv(0, 0, 5)
    assert kinds(check_trace(tr.events)) == ["causal"]


def test_causal_detected_whatever_the_node_interleaving() -> None:
    """Per-node concatenation (delivering node first) finds the same violation."""
    tr = chain().dlv(2, 1, 7).dlv(2, 0, 5)
    by_node = sorted(tr.events, key=lambda e: -e.node)  # stable: per-node order kept
    assert kinds(check_trace(by_node)) == ["causal"]


@st.composite
def interleavings(draw: st.DrawFn, events: list[TraceEvent]) -> list[TraceEvent]:
    """Any merge of the per-node sequences of ``events``."""
    queues: dict[int, list[TraceEvent]] = {}
    for e in events:
        queues.setdefault(e.node, []).append(e)
    out: list[TraceEvent] = []
    while queues:
        n = draw(st.sampled_from(sorted(queues)))
        out.append(queues[n].pop(0))
        if not queues[n]:
            del queues[n]
    return out


GOOD = chain().dlv(2, 0, 5).dlv(2, 1, 7).pub(2, 8).dlv(0, 2, 8).dlv(1, 2, 8).events
BAD = chain().dlv(2, 1, 7).dlv(2, 0, 5).pub(2, 8).dlv(0, 2, 8).dlv(1, 2, 8).dlv(1, 2, 8).events


@given(interleavings(GOOD), interleavings(BAD), st.integers(0, 30))
def test_result_does_not_depend_on_interleaving_or_chunking(
    good: list[TraceEvent], bad: list[TraceEvent], cut: int
) -> None:
    assert check_trace(good, quiescent=True) == []
    assert kinds(check_trace(bad, quiescent=True)) == ["causal", "duplicate"]
    checker = TraceChecker()
    checker.feed(bad[:cut])
    checker.feed(bad[cut:])
    assert kinds(checker.violations(quiescent=True)) == ["causal", "duplicate"]


# ----------------------------------------------------- 6 liveness, agreement


def test_liveness_missing_delivery() -> None:
    tr = base().pub(0, 1).dlv(1, 0, 1)
    assert check_trace(tr.events) == []  # not over yet: maybe in flight
    (v,) = check_trace(tr.events, quiescent=True)
    assert (v.kind, v.node) == ("liveness", 2)
    assert "(0, 1)" in v.detail


def test_liveness_ignores_who_left_or_joined_late() -> None:
    tr = base().sub(3, confirm=False).pub(0, 1).dlv(1, 0, 1).uns(2).confirm(3)
    assert check_trace(tr.events, quiescent=True) == []


def test_liveness_after_resubscribing() -> None:
    """Only the current subscription counts; a message it owes is still owed."""
    tr = base().uns(2).sub(2).pub(0, 1).dlv(1, 0, 1)
    assert kinds(check_trace(tr.events, quiescent=True)) == ["liveness"]


def test_publisher_must_deliver_its_own_publication() -> None:
    tr = base().pub(0, 1, own=False).dlv(1, 0, 1).dlv(2, 0, 1)
    assert check_trace(tr.events) == []
    (v,) = check_trace(tr.events, quiescent=True)
    assert (v.kind, v.node) == ("own", 0)


# --------------------------------------------------------------- malformed


@pytest.mark.parametrize(
    "trace",
    [
        base().sub(0),  # subscribe twice
        base().uns(0).uns(0),  # unsubscribe twice
        Trace().confirm(0),  # subscribed without subscribe
        base().confirm(0),  # confirmed twice
        base().uns(0).confirm(0),  # confirmed after leaving
    ],
    ids=["sub-twice", "uns-twice", "confirm-without-sub", "confirm-twice", "confirm-after-uns"],
)
def test_malformed_traces(trace: Trace) -> None:
    assert "malformed" in kinds(check_trace(trace.events))


def test_reused_publication_id() -> None:
    tr = base().pub(0, 1).pub(0, 1, "t", own=False)
    assert "malformed" in kinds(check_trace(tr.events))


def test_unknown_event_name() -> None:
    events = [*base().events, TraceEvent(99.0, 0, "explode", T, 0, None)]
    assert kinds(check_trace(events)) == ["malformed"]


# ------------------------------------------------------------------ reports


def test_report_is_readable_and_raises() -> None:
    tr = chain().dlv(2, 1, 7).dlv(2, 0, 5).dlv(2, 0, 5)
    with pytest.raises(AssertionError) as info:
        assert_trace(tr.events)
    text = str(info.value)
    assert "2 violation(s)" in text
    assert "causal: 1" in text
    assert "duplicate: 1" in text
    assert "[causal] node 2 topic 't'" in text


def test_report_truncates() -> None:
    many = [Violation("fifo", n, T, "x") for n in range(30)]
    text = format_violations(many, limit=5)
    assert "... 25 more" in text
    with pytest.raises(AssertionError, match="ctx: 30 violation"):
        assert_no_violations(many, "ctx")
    assert_no_violations([])


# ------------------------------------------------------ real simulated runs


def small_run(seed: int = 7) -> Simulation:
    sim = Simulation([3, 9, 12, 40, 41], seed=seed)
    for k, node in enumerate(sim.ids):
        sim.schedule(k * 7.0, "SUB", node, T)
    for k in range(12):
        sim.schedule(1000.0 + 13.0 * k, "PUB", sim.ids[k % 5], T, b"x")
    sim.schedule(1040.0, "UNS", 41, T)
    sim.run()
    return sim


def test_simulated_run_passes_and_a_tampered_one_fails() -> None:
    sim = small_run()
    trace = sim.recorder.trace
    assert_trace(trace, quiescent=True)
    assert_views(sim)
    # Swap two deliveries from the same source at one node: FIFO and causality break.
    idx = [i for i, e in enumerate(trace) if e.event == "deliver" and e.node == 1 and e.source == 0]
    i, j = idx[0], idx[1]
    tampered = list(trace)
    tampered[i], tampered[j] = tampered[j], tampered[i]
    assert {"causal", "fifo"} <= set(kinds(check_trace(tampered)))
    # Drop one delivery: liveness breaks.
    dropped = [e for k, e in enumerate(trace) if k != i]
    assert kinds(check_trace(dropped, quiescent=True)) == ["liveness"]


def test_check_views_detects_a_stale_view() -> None:
    sim = small_run()
    assert check_views(sim) == []
    # Behind the simulator's back: node 3 leaves, nobody is told.
    sim.nodes[3].unsubscribe(T, sim.now)
    found = check_views(sim)
    assert "not-quiescent" in kinds(found)
    stale = [v for v in found if v.kind == "view"]
    assert stale
    assert all("stale [3]" in v.detail for v in stale)
    with pytest.raises(AssertionError, match="view"):
        assert_views(sim)


def test_check_views_needs_topics_without_a_trace() -> None:
    sim = Simulation([1, 2], record_trace=False)
    with pytest.raises(ValueError, match="topics"):
        check_views(sim)
    assert check_views(sim, topics=[T]) == []


# ------------------------------------------------------------ inert crashes


def test_a_delivery_after_a_crash_is_flagged_in_either_order() -> None:
    """Issue 21: node 22 crashed at 2327.0 and delivered ('t2', 4, 9) at 2327.43.
    The simulator listed the delivery first (processing order), a sorted trace
    lists it after the crash: both are ``inert``."""
    head = [
        TraceEvent(0.0, 4, "subscribe", "t2", 4, None),
        TraceEvent(0.0, 22, "subscribe", "t2", 22, None),
        TraceEvent(0.0, 22, "subscribed", "t2", 22, None),
        TraceEvent(2200.0, 4, "publish", "t2", 4, 9),
    ]
    deliver = TraceEvent(2327.43, 22, "deliver", "t2", 4, 9)
    crash = TraceEvent(2327.0, 22, "crash", "", 22, None)
    (v,) = check_trace([*head, deliver, crash])
    assert (v.kind, v.node) == ("inert", 22)
    assert "acted after crashing" in v.detail
    (w,) = check_trace([*head, crash, deliver])
    assert (w.kind, w.node, w.topic) == ("inert", 22, "t2")
    assert "(4, 9)" in w.detail
    assert "since t=2327.0" in w.detail


def test_events_after_recovery_are_fine_and_time_may_stand_still() -> None:
    tr = base()
    tr.events.append(TraceEvent(tr.clock, 2, "crash", "", 2, None))
    tr.events.append(TraceEvent(tr.clock, 2, "recover", "", 2, None))
    tr.clock += 1
    tr.sub(2).pub(0, 1).dlv(1, 0, 1).dlv(2, 0, 1)
    assert check_trace(tr.events, quiescent=True) == []

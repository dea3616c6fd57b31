"""Adaptive probe timeouts (:mod:`vcube._timing`) and the detector using them.

The estimator is checked against RFC 6298's arithmetic, the bounds as a
Hypothesis property over any sequence of samples, evidence, rounds and
restarts, and the detector end to end: a slow but live node is not suspected
where a fixed timeout suspects it, and a crashed node still is, within
``attempts * max_timeout`` of the probe that found it silent.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vcube import Detector, DetectorConfig, DetectorError, Probe, Reply, SendDetector, Suspected
from vcube._timing import ProbeTimeouts, RttEstimate


def test_rtt_estimate_follows_rfc_6298() -> None:
    est = RttEstimate.first(0.4)
    assert (est.srtt, est.rttvar) == (0.4, 0.2)
    assert est.rto() == pytest.approx(1.2)
    est.add(0.8)  # rttvar from the old srtt: 3/4 * 0.2 + 1/4 * 0.4; srtt 7/8 * 0.4 + 1/8 * 0.8
    assert est.rttvar == pytest.approx(0.25)
    assert est.srtt == pytest.approx(0.45)


def test_fixed_when_the_ceiling_is_the_base() -> None:
    t = ProbeTimeouts(1.0, 1.0)
    t.sample(7, 5.0)
    t.false_suspicion()
    assert not t.adaptive
    assert t.timeout(7) == t.timeout(8) == 1.0


def test_first_timeout_is_conservative_then_follows_samples() -> None:
    t = ProbeTimeouts(1.0, 8.0)
    assert t.timeout(7) == 8.0  # no sample: the ceiling
    t.sample(7, 0.001)
    assert t.timeout(7) == 1.0  # a fast peer: the base
    for _ in range(20):
        t.sample(7, 3.0)
    assert 3.0 < t.timeout(7) < 8.0  # a slow peer: stretched
    t.sample(7, 60.0)
    assert t.timeout(7) == 8.0  # capped
    t.forget(7)
    t.sample(9, 0.001)
    assert t.timeout(7) == 8.0  # a restarted peer starts over
    t.stalled()
    assert (t.health, t.timeout(9)) == (1, 2.0)  # our own stall stretches every timeout


def test_health_multiplies_and_recovers_after_calm_rounds() -> None:
    t = ProbeTimeouts(1.0, 8.0, calm_rounds=5)
    t.sample(7, 0.001)
    t.false_suspicion()
    t.false_suspicion()
    assert (t.health, t.timeout(7)) == (2, 3.0)
    for _ in range(4):
        t.round()
    assert t.health == 2  # not yet a calm stretch
    t.round()
    assert t.health == 1
    for _ in range(5):
        t.round()
    assert (t.health, t.timeout(7)) == (0, 1.0)
    for _ in range(20):
        t.false_suspicion()
    assert t.health == 8
    assert t.timeout(7) == 8.0


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("sample"), st.integers(0, 3), st.floats(0, 100)),
        st.tuples(st.just("evidence"), st.just(0), st.just(0.0)),
        st.tuples(st.just("stall"), st.just(0), st.just(0.0)),
        st.tuples(st.just("round"), st.just(0), st.just(0.0)),
        st.tuples(st.just("forget"), st.integers(0, 3), st.just(0.0)),
    ),
    max_size=60,
)


@given(
    ops=_ops,
    base=st.floats(0.01, 5),
    stretch=st.floats(1, 20),
)
def test_timeouts_stay_within_base_and_ceiling(
    ops: list[tuple[str, int, float]], base: float, stretch: float
) -> None:
    t = ProbeTimeouts(base, base * stretch)
    for op, node, value in ops:
        if op == "sample":
            t.sample(node, value)
        elif op == "evidence":
            t.false_suspicion()
        elif op == "stall":
            t.stalled()
        elif op == "round":
            t.round()
        else:
            t.forget(node)
        assert 0 <= t.health <= t.max_health
        for n in range(5):
            assert base <= t.timeout(n) <= base * stretch + 1e-12


# ------------------------------------------------------------ in the detector --


def _pair(max_timeout: float | None, attempts: int = 1) -> tuple[Detector, Detector]:
    cfg = DetectorConfig(interval=1.0, timeout=1.0, attempts=attempts, max_timeout=max_timeout)
    a, b = Detector(1, 1, config=cfg), Detector(2, 1, config=cfg)
    a.join(2, 1, 0.0)
    b.join(1, 1, 0.0)
    return a, b


def _probe_to(outs: Sequence[object], dest: int) -> Probe:
    (probe,) = [
        o.msg
        for o in outs
        if isinstance(o, SendDetector) and o.dest == dest and isinstance(o.msg, Probe)
    ]
    return probe


def _answer(a: Detector, b: Detector, probe: Probe, at: float) -> None:
    """``b`` answers ``a``'s probe, and the answer reaches ``a`` at ``at``."""
    for o in b.receive(a.me, probe, at):
        if isinstance(o, SendDetector) and isinstance(o.msg, Reply):
            a.receive(b.me, o.msg, at)


def test_a_slow_live_node_is_not_suspected_where_a_fixed_timeout_suspects_it() -> None:
    fixed, _ = _pair(None)
    adaptive, b = _pair(8.0)
    _probe_to(fixed.tick(0.0), 2)
    assert Suspected(2, 1) in fixed.expire(1.0)
    probe = _probe_to(adaptive.tick(0.0), 2)
    assert adaptive.deadline() == 8.0
    assert adaptive.expire(3.0) == []
    _answer(adaptive, b, probe, 3.0)  # answered after 3 s: a sample
    assert adaptive.correct() == {1, 2}
    assert adaptive.timeout_for(2) == 8.0  # srtt 3 + 4 * rttvar 1.5, capped


def _ticks(a: Detector, b: Detector | None, times: list[float], delay: float) -> None:
    """``a`` ticks at ``times``; ``b`` answers each probe ``delay`` later
    (``None``: ``b`` has crashed and answers nothing)."""
    for now in times:
        outs = a.tick(now)
        for o in outs:
            if b is not None and isinstance(o, SendDetector) and isinstance(o.msg, Probe):
                _answer(a, b, o.msg, now + delay)


def test_a_crashed_node_is_suspected_within_attempts_times_the_ceiling() -> None:
    a, b = _pair(8.0)
    _ticks(a, b, [5.0 * k for k in range(12)], 2.5)  # a history of slow answers
    assert 1.0 < a.timeout_for(2) <= 8.0
    sent = 60.0  # b crashed: tick until a probe finds it silent
    while a.deadline() is None:
        sent += 1.0
        a.tick(sent)
    due = a.deadline()
    assert due is not None
    assert sent < due <= sent + 8.0
    assert a.expire(due - 0.01) == []
    assert Suspected(2, 1) in a.expire(due)


def test_false_suspicion_evidence_raises_health() -> None:
    a, b = _pair(8.0)
    _answer(a, b, _probe_to(a.tick(0.0), 2), 0.001)
    assert a.timeout_for(2) == 1.0
    a.tick(1.0)
    probe = _probe_to(a.tick(2.0), 2)
    assert a.deadline() == 3.0
    assert Suspected(2, 1) in a.expire(3.0)
    _answer(a, b, probe, 3.5)  # b was alive all along: a correction
    assert a.health == 1
    assert a.timeout_for(2) == 2.0


def test_max_timeout_below_timeout_is_refused() -> None:
    with pytest.raises(DetectorError, match="max_timeout"):
        DetectorConfig(timeout=1.0, max_timeout=0.5)


def _trio(max_timeout: float | None) -> Detector:
    """Node 0 of a fleet {0, 1, 2} (one per cluster of node 0, so both are
    probed each round) whose first probes were answered quickly."""
    cfg = DetectorConfig(interval=1.0, timeout=1.0, attempts=1, max_timeout=max_timeout)
    a = Detector(0, 1, config=cfg)
    peers = {j: Detector(j, 1, config=cfg) for j in (1, 2)}
    for j, b in peers.items():
        a.join(j, 1, 0.0)
        b.join(0, 1, 0.0)
    for o in a.tick(0.0):
        if isinstance(o, SendDetector) and isinstance(o.msg, Probe):
            _answer(a, peers[o.dest], o.msg, 0.01)
    return a


def _silence(a: Detector, start: float, talker: int | None = None) -> tuple[float, list[object]]:
    """Tick until probes are pending, then expire them at their deadline.  A
    ``talker`` (a known node) is heard from right after each tick."""
    now = start
    while a.deadline() is None:
        now += 1.0
        a.tick(now)
        if talker is not None:
            a.heard(talker, now + 0.01)
    due = a.deadline()
    assert due is not None
    return due, list(a.expire(due))


def test_several_suspicions_at_once_make_the_node_doubt_itself_once() -> None:
    """Nodes 1 and 2 fall silent while node 3 still talks: one more probe each
    (and a raised health score), then both are suspected."""
    a = _trio(8.0)
    a.join(3, 1, 0.0)
    due, first = _silence(a, 1.0, talker=3)
    assert [o for o in first if isinstance(o, Suspected)] == []  # spared, probed again
    assert a.health == 1
    second = a.deadline()
    assert second is not None
    assert second > due
    a.heard(3, second - 0.5)
    assert {o.node for o in a.expire(second) if isinstance(o, Suspected)} == {1, 2}


def test_a_node_that_hears_from_nobody_suspects_itself_first() -> None:
    """Nodes 1 and 2 both silent and nobody else talking: this node is the
    likelier culprit (its own traffic held up), so it keeps probing instead of
    accusing for ``2 * max_timeout`` of silence, then suspects them anyway."""
    a = _trio(8.0)
    quiet_since = 0.01  # the last answer (_trio)
    suspected = _drive(a, until=100.0)
    assert set(suspected) == {1, 2}
    assert min(suspected.values()) >= quiet_since + 2 * 8.0
    assert max(suspected.values()) <= quiet_since + 2 * 8.0 + 8.0 * 9  # health-stretched retry


def _drive(a: Detector, until: float, hint_at: float | None = None) -> dict[int, float]:
    """Rounds every second and expiries at deadlines, as the runtime does, until
    nodes 1 and 2 are suspected; when each was.  ``hint_at``: the transport
    hints at both then (their connections refused)."""
    suspected: dict[int, float] = {}
    tick = now = 1.0
    while len(suspected) < 2 and now < until:
        due = a.deadline()
        if hint_at is not None and hint_at <= min(tick, due or tick):
            out = [o for n in (1, 2) for o in a.probe_now(n, hint_at)]
            hint_at = None
        elif due is None or due >= tick:
            now, tick = tick, tick + 1.0
            out = a.tick(now)
        else:
            now = due
            out = a.expire(now)
        suspected.update((o.node, now) for o in out if isinstance(o, Suspected))
    return suspected


def test_a_hint_means_no_isolation_hold() -> None:
    """A refused connection is evidence against the peer, not this node."""
    suspected = _drive(_trio(8.0), until=100.0, hint_at=1.5)
    assert set(suspected) == {1, 2}
    assert max(suspected.values()) < 0.01 + 2 * 8.0  # before the isolation hold would end


def test_without_adaptive_timeouts_there_is_no_self_doubt() -> None:
    a = _trio(None)
    _, first = _silence(a, 1.0)
    assert {o.node for o in first if isinstance(o, Suspected)} == {1, 2}


def _answered_pair(attempts: int) -> tuple[Detector, Detector]:
    """Two nodes, node 1's first probe to node 2 answered in 1 ms."""
    a, b = _pair(8.0, attempts)
    _answer(a, b, _probe_to(a.tick(0.0), 2), 0.001)
    return a, b


def test_a_silent_retry_backs_off_to_the_ceiling() -> None:
    a, _ = _answered_pair(attempts=2)
    a.tick(1.0)
    _probe_to(a.tick(2.0), 2)  # node 2 went silent
    assert a.deadline() == 3.0  # the first attempt: its round trip, the base
    assert [o.dest for o in a.expire(3.0) if isinstance(o, SendDetector)] == [2]
    assert a.deadline() == 3.0 + 8.0  # the retry: the ceiling
    assert Suspected(2, 1) in a.expire(11.0)


def test_a_hinted_crash_is_suspected_in_ordinary_timeouts() -> None:
    a, _ = _answered_pair(attempts=2)
    a.tick(1.0)
    _probe_to(a.tick(2.0), 2)
    assert a.probe_now(2, 2.5) == []  # the connection was refused: a hint
    a.expire(3.0)
    assert a.deadline() == 4.0  # the retry keeps the base timeout
    assert Suspected(2, 1) in a.expire(4.0)
    b_fresh, _ = _answered_pair(attempts=2)
    b_fresh.tick(1.0)
    _probe_to(b_fresh.probe_now(2, 1.5), 2)  # hinted from the first attempt on
    b_fresh.expire(2.5)
    assert b_fresh.deadline() == 3.5

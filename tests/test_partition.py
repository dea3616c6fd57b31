"""Partitions that heal, in the simulator (scenario actions PARTITION / HEAL).

A LAN's switch splits in two; each side still talks within itself; later it
is whole again.  Checked here:

* the scenario of the deaf fleet (issue 45): six nodes, the publisher and one
  subscriber cut off from the other four for 25 s while it publishes at
  20/s.  Both sides suspect each other; after the heal the fleet merges back
  and every subscriber delivers every publication made after the re-merge.
  With the detector's revival probes switched off (the code before the
  fix), nothing ever crosses between the sides again, and the checks say so;
* the same with the publisher on the large side;
* a partition changes nothing in a run that does not schedule one;
* ``p2p sim`` reads PARTITION and HEAL lines;
* :class:`PartitionMachine`, a Hypothesis state machine: a start that may be a
  boot storm (everyone dials one seed and subscribes before the view has
  converged), random subscribers and publishers, a partition that puts each
  of them on a side drawn by Hypothesis, a heal, time passing; safety after
  every step, and at the end,
  once the detector's convergence bound has passed after the heal, every
  publication reaches every subscriber in its publisher's view, the views
  are the true subscriber sets and membership has converged.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from _cli import sim_lines
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from strategies import populations

from p2p._errors import P2PError, ScenarioError
from p2p.cli import main
from p2p.sim import (
    DETECTOR,
    Simulation,
    TraceChecker,
    TraceEvent,
    assert_no_violations,
    check_trace,
    check_views,
    parse_scenario,
)
from vcube import DetectorConfig

TOPIC = "chat"
T0 = 5000.0
"""When the publisher starts (u.t. read as ms)."""
COUNT = 1300
CUT, HEAL = T0 + 10_000.0, T0 + 35_000.0
SETTLED = 15_000.0
"""After the heal: the re-merge is over (revival probe every 2 rounds,
refutations, re-subscriptions), with room to spare."""


def _deaf_fleet(
    seed: int, small: tuple[int, ...], detector: DetectorConfig = DETECTOR, keep: int = 1000
) -> Simulation:
    """Six nodes, node 0 publishes :data:`COUNT` at 20/s from :data:`T0`; the
    nodes in ``small`` are on another segment from :data:`CUT` to :data:`HEAL`;
    each keeps ``keep`` of its publications for resumes."""
    ids = [0x51 * (k + 1) ** 7 % (1 << 64) for k in range(6)]  # sparse, like real ids
    sim = Simulation(ids, seed=seed, detector=detector, history=keep)
    for n in ids:
        sim.schedule(0.0, "SUB", n, TOPIC)
    for j in range(COUNT):
        sim.schedule(T0 + 50.0 * j, "PUB", ids[0], TOPIC, b"m%d" % j)
    for k in small:
        sim.schedule(CUT, "PARTITION", ids[k], "b")
        sim.schedule(HEAL, "HEAL", ids[k], "")
    return sim


def _late(sim: Simulation) -> tuple[int, Counter[int]]:
    """Publications made once the re-merge is over, and how many each node delivered."""
    trace = sim.recorder.trace
    made = {(e.source, e.seq) for e in trace if e.event == "publish" and e.time > HEAL + SETTLED}
    got = Counter(e.node for e in trace if e.event == "deliver" and (e.source, e.seq) in made)
    return len(made), got


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("small", [(0, 1), (2, 3, 4)], ids=["publisher-small", "publisher-large"])
def test_a_healed_partition_merges_back_and_delivers(seed: int, small: tuple[int, ...]) -> None:
    sim = _deaf_fleet(seed, small)
    sim.run()
    found = check_trace(sim.recorder.trace, quiescent=True) + check_views(sim)
    assert_no_violations(found, f"seed {seed}")
    made, got = _late(sim)
    assert made > 100
    assert all(got[n] == made for n in range(6)), (made, got)
    m = sim.membership_metrics()
    assert m["converged"] is True, m
    assert sim.link_metrics()["dial_failures"] > 0  # the cut was felt


@pytest.mark.parametrize("seed", [1, 2])
def test_without_revival_probes_the_two_sides_never_merge(seed: int) -> None:
    """The deaf fleet on the code before the fix: once both sides suspect
    each other, no node probes a suspected one and nothing crosses again;
    the cut-off subscribers deliver nothing made after the heal."""
    detector = dataclasses.replace(DETECTOR, revive=0)
    sim = _deaf_fleet(seed, (0, 1), detector)
    sim.run()
    made, got = _late(sim)
    assert made > 100
    assert [got[n] for n in (2, 3, 4, 5)] == [0, 0, 0, 0], got
    assert sim.membership_metrics()["agreed"] is False
    found = check_views(sim)
    assert any(v.kind == "view" for v in found), found


def test_a_run_without_partition_keeps_no_segment() -> None:
    sim = Simulation(list(range(4)), seed=1, detector=DETECTOR)
    for n in range(4):
        sim.schedule(0.0, "SUB", n, TOPIC)
    sim.schedule(10.0, "PUB", 0, TOPIC, b"x")
    sim.run()
    assert sim.segment == {}
    assert sim.link_metrics() == {}  # no tracked links: the run is what it was
    assert not any(e.view for e in sim.recorder.trace if e.event == "publish")


def test_partition_needs_the_detector() -> None:
    sim = Simulation(list(range(3)), seed=1)
    with pytest.raises(P2PError, match="PARTITION needs the failure detector"):
        sim.schedule(0.0, "PARTITION", 1, "b")


def test_scenario_lines() -> None:
    actions = parse_scenario(["1;PARTITION;2;left", "5;HEAL;*"], 3)
    assert [(a.action, a.node, a.topic) for a in actions] == [
        ("PARTITION", 2, "left"),
        ("HEAL", 0, ""),
        ("HEAL", 1, ""),
        ("HEAL", 2, ""),
    ]
    with pytest.raises(ScenarioError, match="PARTITION needs the segment's name"):
        parse_scenario(["1;PARTITION;2"], 3)
    with pytest.raises(ScenarioError, match="HEAL takes no topic"):
        parse_scenario(["1;HEAL;2;x"], 3)


def test_p2p_sim_takes_partition_lines(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    lines = ["0;SUB;*;t"]
    lines += [f"{2000 + 100 * j};PUB;0;t;m{j}" for j in range(400)]
    lines += ["4000;PARTITION;3;b", "4000;PARTITION;4;b", "20000;HEAL;*"]
    doc, trace = sim_lines(tmp_path, lines, 5)
    assert doc["membership"]["converged"] is True, doc["membership"]
    assert doc["membership"]["reincarnations"] >= 2  # both sides suspected the other
    assert main(["check", str(trace)]) == 0  # the publications carry their views
    capsys.readouterr()


# ------------------------------------------------------------------ property

FAST = DetectorConfig(
    interval=200.0, timeout=300.0, attempts=2, max_timeout=2400.0, revive=2, revive_rounds=600
)


class PartitionMachine(RuleBasedStateMachine):
    """Subscribe / publish / partition (a side drawn per node) / heal / restart
    with state / time."""

    def __init__(self) -> None:
        super().__init__()
        self.sim: Simulation | None = None
        self.checker = TraceChecker()
        self.fed = 0
        self.ids: list[int] = []
        self.subscribed: set[int] = set()
        self.cut: frozenset[int] = frozenset()
        self.healed_at = 0.0
        self.payloads = 0
        self.restarted: set[int] = set()
        self.busy_until = 0.0
        """A restart in progress ends here (no second one, no partition, before)."""

    @initialize(ids=populations(3, 9), seed=st.integers(0, 2**32 - 1), storm=st.booleans())
    def start(self, ids: list[int], seed: int, storm: bool) -> None:
        """``storm``: a boot storm, every node started at once knowing only one
        seed (which knows one other), so the first subscriptions are made with
        a partial view and must be completed as it grows."""
        self.ids = ids
        seeds = {ids[0]: [ids[1]], **{n: [ids[0]] for n in ids[1:]}} if storm else None
        self.sim = Simulation(ids, seed=seed, detector=FAST, introductions=seeds)

    def _now(self) -> float:
        assert self.sim is not None
        return self.sim.now

    @rule(k=st.integers(0, 8))
    def subscribe(self, k: int) -> None:
        node = self.ids[k % len(self.ids)]
        if node in self.subscribed:
            return
        assert self.sim is not None
        self.sim.schedule(self._now(), "SUB", node, TOPIC)
        self.subscribed.add(node)

    @rule(k=st.integers(0, 8), n=st.integers(1, 20))
    def publish(self, k: int, n: int) -> None:
        node = self.ids[k % len(self.ids)]
        if node not in self.subscribed:
            return
        assert self.sim is not None
        for j in range(n):
            self.payloads += 1
            self.sim.schedule(self._now() + 20.0 * j, "PUB", node, TOPIC, b"p%d" % self.payloads)

    @precondition(lambda self: not self.cut)
    @rule(side=st.sets(st.integers(0, 8), min_size=1))
    def partition(self, side: set[int]) -> None:
        cut = frozenset(self.ids[k % len(self.ids)] for k in side)
        if len(cut) == len(self.ids) or self._now() < self.busy_until:
            return
        assert self.sim is not None
        for node in sorted(cut):
            self.sim.schedule(self._now(), "PARTITION", node, "b")
        self.cut = cut
        note(f"cut off: {sorted(self.sim.index[n] for n in cut)}")

    @precondition(lambda self: bool(self.cut))
    @rule()
    def heal(self) -> None:
        assert self.sim is not None
        for node in sorted(self.cut):
            self.sim.schedule(self._now(), "HEAL", node, "")
        self.cut = frozenset()
        self.healed_at = self._now()

    @precondition(lambda self: not self.cut)
    @rule(k=st.integers(0, 8), down=st.sampled_from([300.0, 3000.0]))
    def restart(self, k: int, down: float) -> None:
        """A subscriber is killed and started again ``down`` later with its node
        directory (RESTART: its frontier kept), and subscribes again."""
        node = self.ids[k % len(self.ids)]
        if node not in self.subscribed or self._now() < self.busy_until:
            return
        assert self.sim is not None
        now = self._now()
        self.sim.schedule(now, "CRASH", node, "")
        self.sim.schedule(now + down, "RESTART", node, "")
        self.sim.schedule(now + down + 1.0, "SUB", node, TOPIC)
        self.busy_until = now + down + 2.0
        self.restarted.add(node)

    @rule(dt=st.sampled_from([50.0, 400.0, 2000.0, 8000.0]))
    def advance(self, dt: float) -> None:
        assert self.sim is not None
        self.sim.run(until=self._now() + dt)

    @invariant()
    def safe(self) -> None:
        """Causal order, FIFO, exactly once, nothing invented, so far."""
        if self.sim is None:
            return
        trace = self.sim.recorder.trace
        self.checker.feed(trace[self.fed :])
        self.fed = len(trace)
        assert_no_violations(self.checker.violations(quiescent=False), "safety")

    def teardown(self) -> None:
        sim = self.sim
        if sim is None:
            return
        if self.cut:
            self.heal()
        # After the detector's convergence bound every view agrees; then each
        # subscribed publisher publishes once more, and all of it must arrive.
        sim.run(until=self._now() + 2 * sim.detection_bound())
        settled = self._now()
        for node in sorted(self.subscribed):
            self.payloads += 1
            sim.schedule(self._now(), "PUB", node, TOPIC, b"last%d" % self.payloads)
        sim.run()
        m = sim.membership_metrics()
        note(repr(m))
        note(repr(sim.link_metrics()))
        found = check_trace(sim.recorder.trace, quiescent=True) + check_views(sim)
        assert_no_violations(found, f"seed {sim.seed}")
        assert m["converged"] is True, m
        trace = sim.recorder.trace
        last = {(e.source, e.seq) for e in trace if e.event == "publish" and e.time >= settled}
        assert len(last) == len(self.subscribed)
        for node in self.subscribed:  # views converged: every subscriber gets all of them
            got = {
                (e.source, e.seq)
                for e in trace
                if e.event == "deliver" and e.node == sim.index[node]
            }
            assert last <= got, (sim.index[node], sorted(last - got))
        self._nothing_lost_silently(trace)

    def _nothing_lost_silently(self, trace: list[TraceEvent]) -> None:
        """Per subscriber and source (one that never restarted: a restart ends
        a numbering), every publication made from the subscriber's first
        delivery of it on is delivered, or counted in a gap, exactly."""
        assert self.sim is not None
        steady = {self.sim.index[n] for n in self.ids if n not in self.restarted}
        made: dict[int, list[int]] = {}
        for e in trace:
            if e.event == "publish" and e.source in steady:
                assert e.seq is not None
                made.setdefault(e.source, []).append(e.seq)
        got: dict[tuple[int, int], set[int]] = {}
        missed: Counter[tuple[int, int]] = Counter()
        for e in trace:
            if e.event == "deliver" and e.source in made and e.node != e.source:
                assert e.seq is not None
                got.setdefault((e.node, e.source), set()).add(e.seq)
            elif e.event == "gap" and e.source in made:
                assert e.seq is not None
                missed[(e.node, e.source)] += e.seq
        for (node, source), seqs in got.items():
            first = made[source].index(min(seqs))
            owed = len(made[source]) - first
            assert len(seqs) + missed[(node, source)] == owed, (node, source, owed, len(seqs))


PartitionMachine.TestCase.settings = settings(
    deadline=None, stateful_step_count=25, max_examples=settings().max_examples
)
test_partition_machine = PartitionMachine.TestCase

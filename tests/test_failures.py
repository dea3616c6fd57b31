"""Crash-stop failures in the simulator: repair, retransmission, relays (issue 5).

The guarantees (docs/failures.md) are checked on whole runs by the trace
checker: validity (a publication of a publisher that stays up reaches every
subscriber that stays up), agreement (one delivered by a node that stays up
reaches them too), integrity (no duplicates, nothing invented), per-source
FIFO and causal order per topic.  Failure detection here is the simulator's
oracle: every node hears of a crash or a recovery ``detect_delay`` plus a
seeded jitter later, in any order relative to traffic.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from strategies import populations, raw_steps
from test_properties import LinkTable, link_delays

from p2p import ScenarioError
from p2p.sim import (
    DelayModel,
    Script,
    Simulation,
    TraceEvent,
    check_trace,
    check_views,
    legal_script,
    parse_scenario,
)
from p2p.sim._checks import assert_no_violations
from topics import VCubePS


def run_checked(sim: Simulation) -> None:
    """Run to quiescence; every trace check (liveness included) and the views hold,
    and no node that is up still holds a publication of a source that is up."""
    sim.run()
    assert sim.quiescent(), "simulation did not quiesce"
    found = check_trace(sim.recorder.trace, quiescent=True) + check_views(sim)
    assert_no_violations(found, f"seed {sim.seed}")
    for n, core in sim.nodes.items():
        if n in sim.down:
            continue
        assert isinstance(core, VCubePS)
        for topic, state in core._topics.items():
            stuck = [m.id for m in state.buffer.items() if m.id.source not in sim.down]
            assert not stuck, f"node {n} holds {stuck} on {topic} from live sources"


def core(sim: Simulation, n: int) -> VCubePS:
    c = sim.nodes[n]
    assert isinstance(c, VCubePS)
    return c


# ----------------------------------------------------------------- scenarios


def test_scenario_lines_for_failures_parse() -> None:
    acts = parse_scenario(["10;CRASH;2", "20;recover;2", "5;SUB;1;t"], 4)
    assert [(a.time, a.action, a.node, a.topic) for a in acts] == [
        (5.0, "SUB", 1, "t"),
        (10.0, "CRASH", 2, ""),
        (20.0, "RECOVER", 2, ""),
    ]
    with pytest.raises(ScenarioError, match="takes no topic"):
        parse_scenario(["1;CRASH;0;t"], 2)
    with pytest.raises(ScenarioError, match="fields"):
        parse_scenario(["1;PUB;0"], 2)


def test_a_relay_crashing_mid_round_is_repaired_around() -> None:
    """Node 4 relays 0's round to 5..7 in the 8-node tree; it crashes as the
    round reaches it.  0 hears of the crash and sends 4's share to 5, the next
    correct node of that cluster, which takes over the sub-cube: 5..7 deliver
    the round exactly once and its ACK wave completes."""
    sim = Simulation(list(range(8)), seed=1)
    sim.preset_subscriptions("t", range(8))
    sim.schedule(10.0, "PUB", 0, "t", b"m")
    sim.schedule(10.5, "CRASH", 4, "")
    run_checked(sim)
    assert core(sim, 0).repaired == 1
    acked = [e for e in sim.recorder.trace if e.event == "deliver" and e.node in (5, 6, 7)]
    assert len(acked) == 3
    assert core(sim, 0).idle()
    delivered = {ev.node for ev in sim.recorder.trace if ev.event == "deliver"}
    assert delivered == set(range(8)) - {4}


def test_a_publisher_crashing_mid_round_is_relayed_to_everyone() -> None:
    """0 crashes right after sending its round to its first child only (the
    link to the others is slow): the node that got it relays it when it hears
    of the crash, so every correct subscriber delivers it or none does."""

    def slow_from_zero(src: int, dst: int, rng: object) -> float:
        return 5000.0 if src == 0 and dst != 1 else 50.0

    sim = Simulation(list(range(8)), seed=2, link_delay=slow_from_zero)
    sim.preset_subscriptions("t", range(8))
    sim.schedule(10.0, "PUB", 0, "t", b"m")
    sim.schedule(20.0, "CRASH", 0, "")
    run_checked(sim)
    delivered = {ev.node for ev in sim.recorder.trace if ev.event == "deliver"}
    assert delivered == set(range(8))  # 0 itself at publish, the rest by the relay
    assert sum(core(sim, n).relayed for n in range(1, 8)) >= 1
    assert sum(core(sim, n).duplicates for n in range(1, 8)) >= 1  # the slow originals


def test_a_repair_child_crashing_in_turn_is_repaired_again() -> None:
    """Found by the crash property test: 5 subscribes, 1 (its child) is dead,
    so 5 repairs 1's share to 0; 0 acks that repair copy and crashes while
    the ACK is in flight.  5 hears of 0's crash first and repairs again to 3:
    the late ACK of the superseded copy is ignored, not taken for an
    attack, and the SUB round still completes."""
    sim = Simulation(
        list(range(6)),
        seed=0,
        link_delay=lambda s, d, r: 500.0,
        detect_delay=200.0,
        detect_jitter=100.0,
    )
    sim.schedule(0.0, "SUB", 0, "t")
    sim.schedule(0.0, "CRASH", 1, "")
    sim.schedule(0.0, "SUB", 5, "t")
    sim.schedule(2762.0, "CRASH", 0, "")
    sim.schedule(5000.0, "PUB", 5, "t", b"after")
    run_checked(sim)
    assert core(sim, 5).repaired == 2
    got = {ev.node for ev in sim.recorder.trace if ev.event == "deliver" and ev.source == 5}
    assert got == {5}  # the only live subscriber left


def test_a_recovered_node_is_a_new_incarnation_that_can_subscribe_again() -> None:
    sim = Simulation(list(range(6)), seed=3)
    for n in range(6):
        sim.schedule(0.0, "SUB", n, "t")
    sim.schedule(1000.0, "PUB", 2, "t", b"before")
    sim.schedule(1200.0, "CRASH", 2, "")
    sim.schedule(5000.0, "RECOVER", 2, "")
    sim.schedule(5100.0, "SUB", 2, "t")
    sim.schedule(9000.0, "PUB", 2, "t", b"after")
    sim.schedule(9000.0, "PUB", 3, "t", b"to-2")
    run_checked(sim)
    assert core(sim, 2).incarnation == 1
    late = [ev for ev in sim.recorder.trace if ev.event == "deliver" and ev.time > 9000]
    assert {ev.node for ev in late if ev.source == 2} == set(range(6)) - {2}
    assert 2 in {ev.node for ev in late if ev.source == 3}


def test_calls_on_a_crashed_node_are_refused() -> None:
    sim = Simulation(list(range(4)), seed=4)
    sim.schedule(0.0, "CRASH", 1, "")
    sim.schedule(1.0, "SUB", 1, "t")
    sim.run()
    assert [r[2] for r in sim.recorder.refusals] == ["SUB"]
    assert "crashed" in sim.recorder.refusals[0][4]


def test_p2p_sim_runs_a_scenario_with_failures(tmp_path: Path) -> None:
    scenario = tmp_path / "s.txt"
    scenario.write_text(
        "0;SUB;*;news\n500;PUB;0;news;a\n520;CRASH;3\n530;PUB;1;news;b\n"
        "3000;RECOVER;3\n3100;SUB;3;news\n6000;PUB;3;news;c\n"
    )
    trace = tmp_path / "trace.jsonl"
    subprocess.run(
        [sys.executable, "-m", "p2p", "sim", "--nodes", "8", str(scenario), "--trace", str(trace)],
        check=True,
        capture_output=True,
    )
    events = [TraceEvent(**json.loads(line)) for line in trace.read_text().splitlines()]
    assert [e.event for e in events if e.event in ("crash", "recover")] == ["crash", "recover"]
    assert_no_violations(check_trace(events, quiescent=True))
    c_deliveries = [e for e in events if e.event == "deliver" and e.source == 3]
    assert len(c_deliveries) == 8  # every node, 3 itself included, delivered c


def test_the_checker_catches_a_lost_publication_of_a_correct_publisher() -> None:
    """The checker is not blind under failures: drop one delivery from a clean
    run with a crash and liveness fails."""
    sim = Simulation(list(range(8)), seed=1)
    sim.preset_subscriptions("t", range(8))
    sim.schedule(10.0, "PUB", 0, "t", b"m")
    sim.schedule(10.5, "CRASH", 4, "")
    sim.run()
    trace = list(sim.recorder.trace)
    victim = next(i for i, e in enumerate(trace) if e.event == "deliver" and e.node == 6)
    found = check_trace(trace[:victim] + trace[victim + 1 :], quiescent=True)
    assert [v.kind for v in found] == ["liveness"]


# ------------------------------------------------ cases the property test found

# Each failed before its fix (the ``verify`` profile found them); see docs/failures.md.
HI, HI2 = 11_400_714_819_323_198_485, 11_400_714_819_323_198_741
N2, N3 = 4_354_685_564_936_845_354, 15_755_400_384_260_043_839
OLDER_OP: Script = [
    (0.0, "SUB", 0, "t0"), (0.0, "SUB", 2, "t0"), (0.0, "SUB", 3, "t0"), (0.0, "CRASH", 3, ""),
    (0.0, "RECOVER", 3, ""), (0.0, "SUB", 3, "t0"), (0.0, "SUB", 4, "t0"), (2.0, "SUB", 1, "t0"),
    (469.0, "CRASH", 4, ""), (2406.0, "UNS", 0, "t0"), (2974.0, "PUB", 3, "t0"),
]  # fmt: skip
"""The common start of the two ``older-op-round`` cases."""

FOUND: dict[str, tuple[list[int], Script, float, float]] = {
    # A subscription confirmed late skips a crashed source's publication that a
    # later one depends on: the later one must still wait for its causal past.
    "skipped-past": (
        [604, 860, 362, 46956, 76318, 281848, 140599, 9689657, 748500, 426841, 364, 3457],
        [(0.0, "SUB", 426841, "t0"), (0.0, "SUB", 748500, "t0"), (0.0, "SUB", 46956, "t0"),
         (0.0, "SUB", 76318, "t0"), (0.0, "SUB", 604, "t0"), (0.5, "PUB", 426841, "t0"),
         (0.9, "SUB", 364, "t0"), (1.0, "SUB", 9689657, "t0"), (12.2, "SUB", 140599, "t0"),
         (18.5, "SUB", 860, "t0"), (64.0, "UNS", 426841, "t0"), (100.0, "SUB", 426841, "t0"),
         (448.9, "PUB", 46956, "t0"), (466.7, "SUB", 281848, "t0"), (500.0, "CRASH", 281848, ""),
         (1011.4, "PUB", 76318, "t0"), (1280.4, "PUB", 604, "t0"), (1519.3, "PUB", 860, "t0"),
         (1713.3, "PUB", 604, "t0"), (1717.3, "PUB", 860, "t0"), (2534.2, "PUB", 140599, "t0"),
         (3284.3, "CRASH", 76318, ""), (4425.4, "PUB", 364, "t0"),
         (4592.7, "CRASH", 140599, ""), (5267.8, "PUB", 748500, "t0"),
         (5999.0, "UNS", 604, "t0")],
        3000.0, 3000.0,
    ),
    # One publication held twice for one child (a crashed source's last round
    # relayed again): releasing one hold raised KeyError in the core.
    "held-twice": (
        [362, 604, 860, 46956, 76318, 140599, 281848, 426841, 748500, 9689657, 0, 3457],
        [(0.0, "SUB", 362, "t0"), (0.0, "SUB", 46956, "t0"), (0.0, "SUB", 76318, "t0"),
         (0.0, "SUB", 9689657, "t0"), (0.0, "PUB", 9689657, "t0"), (0.0, "SUB", 748500, "t0"),
         (0.9, "SUB", 0, "t0"), (1.0, "SUB", 426841, "t0"), (12.2, "SUB", 281848, "t0"),
         (18.5, "SUB", 604, "t0"), (448.9, "PUB", 46956, "t0"), (466.7, "SUB", 3457, "t0"),
         (500.0, "CRASH", 3457, ""), (1011.4, "PUB", 76318, "t0"), (1200.8, "CRASH", 140599, ""),
         (1280.4, "PUB", 362, "t0"), (1519.3, "PUB", 604, "t0"), (1717.3, "UNS", 9689657, "t0"),
         (2534.2, "PUB", 281848, "t0"), (3281.2, "UNS", 362, "t0"), (3620.2, "SUB", 362, "t0"),
         (4425.4, "PUB", 0, "t0"), (4592.7, "CRASH", 281848, ""), (5267.8, "CRASH", 76318, ""),
         (5999.0, "UNS", 362, "t0")],
        3000.0, 3000.0,
    ),
    # The same, the second hold lost when holds were flushed at a crash: a
    # repair round then waited forever for the child it never reached.
    "flushed-hold": (
        [256, 512, 768, 14080, 76288, 32768, 281088, 0, 655360,
         HI2, HI, 3328],
        [(0.0, "SUB", HI2, "t0"), (0.0, "SUB", 14080, "t0"), (0.0, "SUB", 281088, "t0"),
         (0.0, "SUB", 256, "t0"), (0.0, "SUB", 655360, "t0"), (0.0, "UNS", 14080, "t0"),
         (0.0, "SUB", 76288, "t0"), (0.0, "UNS", 256, "t0"), (1.0, "SUB", 768, "t0"),
         (1.0, "SUB", 0, "t0"), (2.0, "SUB", 512, "t0"), (137.0, "SUB", HI, "t0"),
         (212.0, "SUB", 256, "t0"), (463.0, "SUB", 3328, "t0"), (465.0, "CRASH", 3328, ""),
         (519.0, "PUB", 256, "t0"), (520.0, "UNS", 256, "t0"), (582.0, "CRASH", 768, ""),
         (583.0, "PUB", 76288, "t0"), (583.0, "SUB", 256, "t0"), (583.0, "UNS", 256, "t0"),
         (583.0, "SUB", 256, "t0"), (1067.0, "PUB", 281088, "t0"),
         (4499.0, "CRASH", 281088, ""), (4966.0, "CRASH", 76288, "")],
        3000.0, 3000.0,
    ),
    # Two nodes restart at once: the simulator put the restarted node's first
    # SUB into a frame still queued to the other's dead incarnation (lost).
    "restart-frame": (
        [0, HI, 1, 4_354_685_564_936_845_354],
        [(0.0, "SUB", 0, "t0"), (0.0, "UNS", 0, "t0"), (0.0, "CRASH", HI, ""),
         (0.0, "SUB", 1, "t0"), (0.0, "CRASH", 1, ""), (0.0, "RECOVER", HI, ""),
         (0.0, "RECOVER", 1, ""), (1.0, "SUB", 1, "t0")],
        200.0, 100.0,
    ),
    # A round in flight to a subscriber's old incarnation was taken, in the
    # bound given to its new one, as reaching it: a publication owed forever.
    "old-life-round": (
        [0, 1, 2, 3, 4],
        [(0.0, "SUB", 0, "t0"), (0.0, "CRASH", 3, ""), (0.0, "RECOVER", 3, ""),
         (0.0, "SUB", 4, "t0"), (0.0, "SUB", 3, "t0"), (148.0, "CRASH", 4, ""),
         (202.0, "PUB", 3, "t0"), (449.0, "RECOVER", 4, ""), (3168.0, "SUB", 4, "t0"),
         (3270.0, "PUB", 0, "t0")],
        3000.0, 3000.0,
    ),
    # The same through an older subscription of the same life: node 0 left
    # and subscribed again while 3's round (to its old subscription) was in
    # flight; 3's bound for the announce owed 0 that round, which 0 had
    # received unsubscribed.  Two draws of one run (9 nodes, links 1 + U(0, 1)).
    "older-op-round": (
        list(range(9)),
        [(0.0, "SUB", 0, "t0"), (0.0, "UNS", 0, "t0")] * 13 + OLDER_OP
        + [(4249.0, "RECOVER", 4, ""), (4645.0, "SUB", 0, "t0"), (4660.0, "PUB", 1, "t0")],
        3000.0, 3000.0,
    ),
    "older-op-round-2": (
        list(range(9)),
        [(0.0, "SUB", 0, "t0"), (0.0, "UNS", 0, "t0")] * 13 + OLDER_OP
        + [(2979.0, "RECOVER", 4, ""), (4332.0, "SUB", 0, "t0"), (4677.0, "PUB", 1, "t0")],
        3000.0, 3000.0,
    ),
    # Crash only.  9 crashes, then 7 publishes (its round to 8 goes through 9,
    # lost) and crashes.  8 hears of 7's crash first and relays 7's older round;
    # 1 got that relay, all duplicates, before hearing of the crash, and took it
    # for 7's last round: it relayed the older round, and 8 never got 7's last
    # publication, which 1 had delivered (agreement).
    "relayed-older-round": (
        list(range(15)),
        [(0.0, "SUB", 0, "t0"), (0.0, "UNS", 0, "t0")] * 12
        + [(0.0, "SUB", 1, "t0"), (0.0, "SUB", 7, "t0"), (0.0, "PUB", 7, "t0"),
           (0.0, "SUB", 9, "t0"), (0.0, "SUB", 8, "t0"), (5175.0, "CRASH", 9, ""),
           (5451.0, "PUB", 7, "t0"), (5732.0, "CRASH", 7, "")],
        1000.0, 500.0,
    ),
    # A late crash notice.  1 restarts, not yet told that 2 (incarnation 1)
    # crashed, and subscribes: 2 gives no bound.  1 delivers (0, 7), whose
    # predecessor (0, 6) predates the subscription (skipped unseen) and follows
    # 2's (2, 1).  0 then hears of 2's crash and relays 2's last round, (2, 1),
    # the first publication of a stream with no bound: it was delivered, after
    # (0, 7) (causal).  Now a stream with no bound delivers only what shows it
    # is post-subscription (VCubePS._shows_post).
    "late-crash-notice": (
        [0, HI, N2, N3],
        [(0.0, "SUB", HI, "t0"), (0.0, "CRASH", 0, ""), (0.0, "CRASH", N2, ""),
         (0.0, "RECOVER", 0, ""), (0.0, "RECOVER", N2, ""), (0.0, "SUB", 0, "t0"),
         (0.0, "SUB", N2, "t0"), (0.0, "SUB", N3, "t0"), (0.0, "PUB", 0, "t0"),
         (0.0, "PUB", N2, "t0"), (33.0, "UNS", N2, "t0"), (39.0, "SUB", N2, "t0"),
         (36.0, "CRASH", HI, ""), (37.0, "PUB", 0, "t0"), (37.0, "PUB", 0, "t0"),
         (39.0, "CRASH", N2, ""), (37.0, "UNS", 0, "t0"), (37.0, "SUB", 0, "t0"),
         (36.0, "RECOVER", HI, ""), (61.0, "RECOVER", N2, ""), (61.0, "PUB", 0, "t0"),
         (1077.3938598945751, "SUB", HI, "t0"), (1089.821968932823, "PUB", 0, "t0")],
        1000.0, 500.0,
    ),
    # A skipped publication's past on its way (verify profile, seed 0, 15
    # nodes, links 5, detection 3,000 + U(0, 3,000)).  Node 2 is confirmed
    # after node 5 crashed and came back: 5's first life is retired there.  It
    # delivered (6, 1), which names 5's skipped (5, 1), before (13, 1), which
    # (5, 1) follows and which came late behind crashed relays.  What names a
    # publication of a crashed stream whose past is unknown here now waits for
    # a fence decision on that stream and for live members' streams to come up
    # to its marks (VCubePS._await_marks).
    "skipped-past-on-its-way": (
        list(range(15)),
        [(0.0, "SUB", 0, "t0"), (0.0, "UNS", 0, "t0")] * 4
        + [(0.0, "SUB", 0, "t0"), (0.0, "SUB", 13, "t0"), (0.0, "UNS", 0, "t0")]
        + [(0.0, "SUB", 0, "t0"), (0.0, "UNS", 0, "t0")] * 23
        + [(0.0, "SUB", 6, "t0"), (0.0, "SUB", 5, "t0")]
        + [(0.0, "SUB", 0, "t0"), (0.0, "UNS", 0, "t0")] * 2
        + [(0.0, "SUB", 0, "t0"), (0.0, "SUB", 1, "t0"), (25.0, "UNS", 0, "t0"),
           (882.4, "SUB", 0, "t0"), (2024.0, "SUB", 2, "t0"), (2047.9, "CRASH", 4, ""),
           (2125.9, "CRASH", 1, ""), (2220.1, "PUB", 13, "t0"), (2244.5, "UNS", 0, "t0"),
           (2568.9, "PUB", 5, "t0"), (4528.5, "CRASH", 5, ""), (5345.5, "PUB", 6, "t0"),
           (5428.5, "SUB", 0, "t0"), (5765.1, "RECOVER", 5, "")],
        3000.0, 3000.0,
    ),
    # The same with a DEAD_BOUND (verify profile, seed 1035, 15 nodes, links
    # 5 + U(0, 30), detection 3,000 + U(0, 3,000); on b2f006e too).  Node 2,
    # confirmed after node 5 crashed but before its own detector said so,
    # skipped 5's (5, 2) under the SUB ACK's DEAD_BOUND and delivered (14, 3),
    # which names it, before (13, 2), which (5, 2) follows.  A DEAD_BOUND now
    # counts as a crash for the fence question (VCubePS._undecided).
    "dead-bound-past-on-its-way": (
        list(range(15)),
        [(0.0, "SUB", 0, "t0"), (0.0, "UNS", 0, "t0"), (0.0, "SUB", 14, "t0"),
         (0.0, "SUB", 9, "t0"), (0.0, "SUB", 2, "t1"), (0.0, "SUB", 12, "t0"),
         (0.0, "UNS", 14, "t0"), (0.0, "SUB", 7, "t1"), (0.0, "SUB", 0, "t0"),
         (0.0, "SUB", 1, "t1"), (0.0, "PUB", 1, "t1"), (0.0, "SUB", 6, "t1"),
         (0.0, "PUB", 6, "t1"), (0.0, "SUB", 9, "t1"), (0.0, "SUB", 12, "t1"),
         (0.0, "PUB", 0, "t0"), (0.0, "SUB", 4, "t0"), (0.2, "SUB", 4, "t1"),
         (1.0, "SUB", 6, "t0"), (1.0, "SUB", 14, "t0"), (1.9, "SUB", 13, "t0"),
         (8.0, "PUB", 6, "t0"), (25.0, "UNS", 0, "t0"), (206.4, "PUB", 6, "t0"),
         (250.1, "PUB", 13, "t0"), (340.4, "SUB", 10, "t0"), (380.0, "SUB", 1, "t0"),
         (491.2, "UNS", 1, "t0"), (746.3, "UNS", 1, "t1"), (747.0, "SUB", 1, "t1"),
         (747.0, "PUB", 1, "t1"), (882.4, "SUB", 0, "t0"), (996.4, "SUB", 7, "t0"),
         (1083.0, "UNS", 0, "t0"), (1083.0, "SUB", 0, "t0"), (1086.5, "SUB", 5, "t0"),
         (1229.6, "SUB", 0, "t1"), (1285.6, "UNS", 12, "t0"), (1288.9, "CRASH", 0, ""),
         (1704.8, "SUB", 1, "t0"), (1973.6, "UNS", 2, "t1"), (1993.0, "CRASH", 4, ""),
         (1993.0, "CRASH", 7, ""), (2024.0, "SUB", 2, "t0"), (2125.9, "CRASH", 1, ""),
         (2161.2, "RECOVER", 0, ""), (2181.5, "SUB", 0, "t0"), (2220.1, "PUB", 13, "t0"),
         (2256.4, "UNS", 9, "t0"), (2505.2, "SUB", 5, "t1"), (2568.9, "PUB", 5, "t0"),
         (2929.6, "CRASH", 9, ""), (3063.1, "UNS", 0, "t0"), (3514.2, "RECOVER", 4, ""),
         (3542.4, "RECOVER", 1, ""), (3838.1, "PUB", 14, "t0"), (3919.3, "UNS", 6, "t1"),
         (4058.6, "SUB", 0, "t0"), (4115.3, "UNS", 0, "t0"), (4210.5, "CRASH", 1, ""),
         (4215.2, "SUB", 0, "t0"), (4528.5, "CRASH", 5, ""), (4711.8, "UNS", 0, "t0"),
         (4718.3, "SUB", 12, "t0"), (4951.2, "SUB", 0, "t0"), (5208.8, "UNS", 0, "t0"),
         (5539.7, "UNS", 14, "t0"), (5612.2, "SUB", 0, "t0"), (5765.1, "UNS", 0, "t0")],
        3000.0, 3000.0,
    ),
}  # fmt: skip
SETTINGS: dict[str, tuple[int, LinkTable | None]] = {
    "late-crash-notice": (19, LinkTable(default=1.0, special={}, jitter=0.0)),
    "relayed-older-round": (60, None),
    "restart-frame": (0, None),
    "old-life-round": (893123, None),
    "older-op-round": (1, LinkTable(default=1.0, special={}, jitter=1.0)),
    "older-op-round-2": (1, LinkTable(default=1.0, special={}, jitter=1.0)),
    "skipped-past-on-its-way": (0, LinkTable(default=5.0, special={}, jitter=0.0)),
    "dead-bound-past-on-its-way": (1035, LinkTable(default=5.0, special={}, jitter=30.0)),
}
"""Seed and link delays of a case, where not 3841 and 40 + U(0, 30)."""


@pytest.mark.parametrize("case", sorted(FOUND))
def test_cases_the_property_test_found(case: str) -> None:
    ids, script, delay, jitter = FOUND[case]
    seed, link = SETTINGS.get(case, (3841, LinkTable(default=40.0, special={}, jitter=30.0)))
    sim = Simulation(ids, seed=seed, link_delay=link, detect_delay=delay, detect_jitter=jitter)
    if link is not None:
        link.index.update(sim.index)
    for time, action, node, topic in script:
        sim.schedule(time, action, node, topic, f"{node}@{time}".encode())
    run_checked(sim)


FUZZ_FOUND = [
    (47, 25.0),
    (340, 25.0),
    (649, 60.0),
    (4691, 60.0),
    (3234, 60.0),
    (70268, 60.0),
    (81681, 60.0),
    (120503, 60.0),
    (121789, 60.0),
]
"""``(seed, tpp_stdev)`` of crash fuzz runs that broke a guarantee (recover mode)."""


@pytest.mark.parametrize(("seed", "tpp_stdev"), FUZZ_FOUND)
def test_the_fuzz_counterexamples_hold(seed: int, tpp_stdev: float) -> None:
    """Crash + recovery fuzz runs that broke a guarantee (docs/failures.md).
    Seeds 47 and 340 are the last two of the "2 of 400": a node restarted
    after others came back must treat their older incarnations as crashed at
    once (its detector says so), or it waits forever for an op of a dead
    incarnation; and the filter of dependencies that can never come was
    skipped when the subscription had retired streams but knew of no crash
    yet, a stall.  Seed 649 (issue 21, wider t_pp spread): node 2 delivered
    source 3's last round, unsubscribed, then heard of 3's crash and did not
    relay that round because it was no longer subscribed, so subscriber 6
    never got (3, 2) and (3, 3) (agreement).  A node now relays the last round
    of every stream that reached it while its subscription was confirmed.
    Seed 4691 (the same spread, liveness): the three holders of dead node 1's
    last round queued their crash relays behind rounds of their own that
    waited on a child crashed unseen, and crashed before sending them; node 6
    held for good node 8's (8, 3), which names (1, 2).  A crash relay now
    leaves at once, beside the node's own round (``VCubePS._relay_now``).
    Seed 3234 (the same spread, liveness) broke only a first cut of
    ``VCubePS._dead_rounds_to``: node 0, back from a crash and not
    subscribed, got dead node 1's last round, which reached nobody else, and
    passed it to node 2 when they met; node 2 delivered it, and nodes 3 to 5
    never got it.  Only a round relayed at the crash (owed) goes on.
    Seed 70268 broke a first cut of the fence (``topics._fence``): node 0,
    back as a new life and the lowest live id, refused as malformed a
    question about its own dead first life's stream.  Seed 81681 broke
    causal order on 1fb4b73 too: node 3, confirmed late, skipped dead node
    6's (6, 2) under a SUB ACK's ``predates`` (no bound came) and delivered
    (7, 2), which names it, before (2, 2) and (1, 1), which (6, 2) follows
    and which were owed there and held.  What names a publication never
    delivered here and never seen now waits for the held publications that
    may precede it (``VCubePS._behind_lost``).  Seeds 120503 and 121789
    (liveness) broke two attempts at the open cases of docs/failures.md ("a
    detector faster than the links"): a fence asked for a stream skipped at
    the confirmation, whose decision a restarted node's new life never got;
    and early publications taken out of arrival order, one held for good
    behind a held one that followed it through one not yet there."""
    from bench.failure_fuzz import run_one

    assert run_one(seed, recover=True, tpp_stdev=tpp_stdev)["broke"] == []


PARTIAL_FOUND = [
    (401393, 300.0),
    (404153, 300.0),
    (702462, 600.0),
    (702530, 600.0),
    (1102671, 450.0),
    (2203593, 900.0),
]
"""``(seed, tpp_stdev)`` of ``partial`` fuzz runs (real detector, nodes
introduced to node 0 only) that broke a guarantee."""


@pytest.mark.parametrize(("seed", "tpp_stdev"), PARTIAL_FOUND)
def test_the_partial_fuzz_counterexamples_hold(seed: int, tpp_stdev: float) -> None:
    """``python -m bench.failure_fuzz --modes partial --tpp-stdev 300`` runs that
    broke.  Seed 401393 broke causal order with no crash at all: node 4
    subscribed alone (a lonely subscription).  An announce ACK's ``predates``
    cut node 3's stream at 2, so the frontier counted (3, 1), which node 3
    published before it knew of node 4, as skipped, and node 4 delivered
    (0, 1), which names (3, 1).  Then node 3's bound said its stream from 1
    on comes to node 4; (3, 1) came and was delivered after (0, 1).  A bound
    now never reopens what a cut settled already (``VCubePS._synced``).
    Seed 404153 broke agreement on the views: node 5, falsely suspected,
    reincarnated, and its new core knew the crashes its machine knew but not
    that node 9 had restarted; a late view entry of node 9's first life
    (subscribed to ``t1``) stayed in node 5's view for good.  A new core now
    learns every member's newest incarnation (``NodeMachine._reincarnate``).
    Seed 702462 (``--tpp-stdev 600``) was the simulator's: node 2 came back
    knowing only its seed, reincarnated before the seed's answer came, and
    the simulator dropped that answer as sent to a crashed life; node 2 never
    admitted a member.  In the runtime a reincarnation is the same process,
    and the answer reaches it: so it does in the simulator now
    (``p2p.sim._world._World.older_lives``).  Seed 702530, the
    simulator's too (it showed once that fix changed the run): node 7's
    detector never ran again after it reincarnated, because its queued
    timer named the older life and was skipped, and no new one was queued
    for the same time; node 7 kept crashed node 8 as a member and its
    rounds waited for it for good.  Seed 1102671 (``--tpp-stdev 450``):
    node 5's frontier for lonely node 2 covered (7, 1), owed to node 2,
    because (7, 1) names (4, 1), which was in a gap of node 5's reception of
    stream 4, and a publication naming one in a gap was not marked
    (``GAP_FROM``, ``VCubePS._note_novel``); node 2 skipped (7, 1).  Seed
    2203593 (``--tpp-stdev 900``, three nodes): restarted node 1 kept node
    0's (0, 1), owed to it, for a fence decision on crashed node 2's stream;
    node 0's announce bound (2: (0, 1) was in a completed round) then took
    it for one that never came, since only the buffer counted as held, and
    skipped it.  What a fence keeps is held too (``_kept_items``)."""
    from bench.failure_fuzz import run_one

    assert run_one(seed, recover=True, tpp_stdev=tpp_stdev, partial=True)["broke"] == []


def test_a_recovered_publication_never_follows_what_it_precedes() -> None:
    """Partial fuzz seed 1090: node 1's subscription, confirmed knowing nobody,
    delivers only what follows its own op; its core skipped node 6's (6, 2)
    and delivered node 3's (3, 3), which follows it.  Node 6's next
    publication showed a gap, the machine resumed, and the recovered (6, 2)
    reached the application after (3, 3).  A recovered publication that
    something already handed on directly follows (``Delivered.deps``) is not
    handed on; it is counted as missed."""
    from bench.failure_fuzz import run_one

    assert run_one(1090, recover=True, partial=True)["broke"] == []


def test_a_late_publication_of_a_restarted_source_is_handed_on() -> None:
    """Recover fuzz seed 1672 (the oracle, 3,000 +- 3,000 u.t.): node 4 held
    node 0's (0, 3) for its causal past until t=6075; node 0 had restarted
    meanwhile and node 4 had delivered the new process's (0, 5).  The core
    delivered (0, 3) at last, and the frontier dropped it as behind the new
    epoch: lost without a count, while nodes 1 and 3 had it.  A previous
    epoch's late publication is now handed on once (``Frontier._late``)."""
    from bench.failure_fuzz import run_one

    assert run_one(1672, recover=True)["broke"] == []


def test_a_resume_is_not_answered_with_a_round_still_on_its_way() -> None:
    """Partial fuzz seed 2100712 (``--tpp-stdev 900``): node 3, back as a new
    life, answered node 0's RESUME with a publication whose round was still
    on its way, then crashed.  Node 0 had it from the history, not from a
    round, so its crash relay did not carry it, and node 2 never got what
    node 0 delivered.  An answer now stops at the first unsettled round
    (``VCubePS.unsettled``)."""
    from bench.failure_fuzz import run_one

    assert run_one(2100712, recover=True, tpp_stdev=900.0, partial=True)["broke"] == []


def test_a_packet_on_its_way_to_an_older_life_reaches_the_new_core() -> None:
    """In the runtime a reincarnation (a false suspicion) keeps the process and
    its connections, so what was on its way to the older life reaches the new
    core; the simulator does the same (``Simulation._same_process``).  Partial
    fuzz seed 2100725 (``--tpp-stdev 900``) has three such link packets, and
    every guarantee still holds."""
    from bench.failure_fuzz import run_one

    found = run_one(2100725, recover=True, tpp_stdev=900.0, partial=True)
    assert found["older_life_packets"] >= 1
    assert found["broke"] == []


# ------------------------------------------------------------------ property


@st.composite
def failure_scripts(draw: st.DrawFn, ids: list[int], topics: list[str], *, recover: bool) -> Script:
    """A timed script of SUB/UNS/PUB, CRASH and (with ``recover``) RECOVER, legal
    at every step (:func:`p2p.sim.legal_script`): a node that is up crashes on
    roll 9 while fewer than half the nodes are down, so trees keep some shape;
    a crashed node stays down, or with ``recover`` comes back as a new
    incarnation at its next step."""
    steps = draw(raw_steps(ids, topics, horizon=6000, rolls=9))
    return legal_script(steps, crash_roll=9, max_down=len(ids) // 2, recover=recover)


SPIKES = st.sampled_from([0.0, 0.0, 3000.0])
"""Extra delay on a few links: beyond the detection delay, so packets of a
crashed node arrive after everyone heard of the crash."""


@settings(max_examples=max(10, settings().max_examples // 2))
@given(
    data=st.data(),
    seed=st.integers(0, 2**32 - 1),
    ntopics=st.integers(1, 2),
    detect=st.sampled_from([(200.0, 100.0), (1000.0, 500.0), (3000.0, 3000.0)]),
)
def test_guarantees_hold_under_crashes_and_recoveries(
    data: st.DataObject, seed: int, ntopics: int, detect: tuple[float, float]
) -> None:
    ids = data.draw(populations(3, 16), label="ids")
    topics = [f"t{k}" for k in range(ntopics)]
    recover = data.draw(st.booleans(), label="recover")
    script = data.draw(failure_scripts(ids, topics, recover=recover), label="script")
    delay: LinkTable | None = None
    if data.draw(st.booleans(), label="per-link delays"):
        delay = data.draw(link_delays(len(ids)), label="delays")
        spike = data.draw(SPIKES, label="spike")
        for pair in list(delay.special)[: max(1, len(delay.special) // 4)]:
            delay.special[pair] += spike
    sim = Simulation(
        ids, seed=seed, link_delay=delay, detect_delay=detect[0], detect_jitter=detect[1]
    )
    if delay is not None:
        delay.index.update(sim.index)
    note(f"failures: {[s for s in script if s[1] in ('CRASH', 'RECOVER')]}")
    for time, action, node, topic in script:
        sim.schedule(time, action, node, topic, f"{node}@{time}".encode())
    run_checked(sim)


# -------------------------------------------------------- crash semantics


CRASH_CASE: Script = [(0.0, "SUB", n, "t2") for n in range(23)] + [
    (500.0 + 100 * k, "PUB", 4, "t2") for k in range(9)
]
"""Issue 21's report, rebuilt: 23 nodes, t_pp stdev 60; shifted by 490.31 u.t.,
node 22 takes the packet with 4's publications 6..9 at 2326.43 and delivers
them at 2327.43, one ``t_pc`` later.  It crashes at 2327.0, inside that window;
before the fix the deliveries still happened."""


def _crash_case(crash: bool) -> Simulation:
    sim = Simulation(list(range(23)), seed=0, delays=DelayModel(tpp_stdev=60))
    for time, action, node, topic in CRASH_CASE:
        sim.schedule(time + 490.31, action, node, topic, b"x")
    if crash:
        sim.schedule(2327.0, "CRASH", 22, "")
    sim.run()
    return sim


def test_a_node_crashing_while_it_processes_a_packet_delivers_nothing() -> None:
    free = _crash_case(crash=False)
    late = [e.time for e in free.recorder.trace if e.node == 22 and e.event == "deliver"]
    window = [t for t in late if 2327.0 < t < 2328.0]
    assert len(window) == 4
    assert window[0] == pytest.approx(2327.43, abs=0.01)
    sim = _crash_case(crash=True)
    after = [e for e in sim.recorder.trace if e.node == 22 and e.time > 2327.0]
    assert after == []
    assert sim.lost >= 1  # the packet it was processing died with it
    assert_no_violations(check_trace(sim.recorder.trace, quiescent=True), "crash case")
    sorted_trace = sorted(sim.recorder.trace, key=lambda e: e.time)
    assert_no_violations(check_trace(sorted_trace, quiescent=True), "sorted")


def test_a_node_crashing_before_its_packets_leave_sends_nothing() -> None:
    """0 publishes at 0: its CPU is busy until 1, its link until 2.  Crashing at
    1.5, mid-transmission, the packet never leaves; 1 never receives it."""
    sim = Simulation([0, 1], delays=DelayModel(tpp_stdev=0))
    sim.preset_subscriptions("t", [0, 1])
    sim.schedule(0.0, "PUB", 0, "t", b"x")
    sim.schedule(1.5, "CRASH", 0, "")
    sim.run()
    assert sim.unsent == 1
    assert [e.event for e in sim.recorder.trace if e.node == 1] == ["subscribe", "subscribed"]


def test_a_call_waiting_for_the_cpu_when_the_node_crashes_is_refused() -> None:
    sim = Simulation([0, 1], delays=DelayModel(tpp_stdev=0))
    sim.preset_subscriptions("t", [0, 1])
    sim.schedule(0.0, "PUB", 0, "t", b"a")
    sim.schedule(0.0, "PUB", 0, "t", b"b")  # gets the CPU at 1.0
    sim.schedule(0.5, "CRASH", 0, "")
    sim.run()
    assert [e.seq for e in sim.recorder.trace if e.event == "publish"] == [1]
    assert [r[4] for r in sim.recorder.refusals] == ["node crashed first"]


def test_a_crash_scheduled_mid_run_comes_after_the_work_already_done() -> None:
    sim = Simulation([0, 1], delays=DelayModel(tpp_stdev=0))
    sim.preset_subscriptions("t", [0, 1])
    sim.schedule(0.0, "PUB", 0, "t", b"x")
    sim.run(until=102.0)  # 1 took the packet at 102, delivers at 103
    assert sim.schedule(102.5, "CRASH", 1, "") == 103.0
    sim.run()
    assert_no_violations(check_trace(sim.recorder.trace, quiescent=True), "mid-run crash")

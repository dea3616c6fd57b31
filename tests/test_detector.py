"""Tests of the VCube failure detector core (:mod:`vcube._detector`).

Unit tests drive detectors by hand (outputs pumped synchronously between them);
the first-round tests are checked against the thesis' Fig. 2.6 cluster table
(de Araujo 2019, §2.4: "p0 only performs tests on nodes 1, 2, 4").  Property
tests run the small deterministic network of :mod:`p2p.sim._detsim` (event heap
ordered by ``(time, seq)``, seeded ``random.Random``); every run is a pure
function of the Hypothesis-drawn integers, which are printed with ``note`` so a
failing example replays from them.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterable

import cbor2
import pytest
from hypothesis import given, note
from hypothesis import strategies as st
from test_vcube import FIG_2_6  # the c(i, s) table of Fig. 2.6, copied from the figure once

import vcube
from p2p.sim._detsim import (
    Delays,
    DetectorNet,
    cbor_size,
    message_size,
    nonempty_clusters,
    run_crash,
    sparse_ids,
)
from vcube import (
    Corrected,
    Detector,
    DetectorConfig,
    DetectorError,
    DetectorOutput,
    Entry,
    Hypercube,
    Joined,
    Left,
    Probe,
    Push,
    RemoteDetectorError,
    Reply,
    Reported,
    Restarted,
    SelfSuspected,
    SendDetector,
    Suspected,
    VCubeError,
    cluster,
    decode_detector,
    depth_and_degree,
    encode_detector,
)


def network(ids: Iterable[int], incarnation: int = 1) -> dict[int, Detector]:
    """Detectors for ``ids``, each joined to all the others."""
    ids = list(ids)
    dets = {i: Detector(i, incarnation) for i in ids}
    for d in dets.values():
        for j in ids:
            if j != d.me:
                d.join(j, incarnation, 0.0)
    return dets


def probes(outs: list[DetectorOutput]) -> list[int]:
    """Destinations of the probes in ``outs``, in order."""
    return [o.dest for o in outs if isinstance(o, SendDetector) and isinstance(o.msg, Probe)]


def events(outs: list[DetectorOutput]) -> list[DetectorOutput]:
    """``outs`` without the sends."""
    return [o for o in outs if not isinstance(o, SendDetector)]


def pump(
    dets: dict[int, Detector], src: int, outs: list[DetectorOutput], now: float, drop: set[int]
) -> dict[int, list[DetectorOutput]]:
    """Deliver ``src``'s sends (and the answers they cause) at once, except to
    or from nodes in ``drop``; returns every node's non-send outputs."""
    seen: dict[int, list[DetectorOutput]] = {i: [] for i in dets}
    queue = [(src, o) for o in outs]
    while queue:
        sender, out = queue.pop(0)
        if not isinstance(out, SendDetector):
            seen[sender].append(out)
        elif out.dest not in drop and sender not in drop:
            queue.extend((out.dest, o) for o in dets[out.dest].receive(sender, out.msg, now))
    return seen


def state(det: Detector) -> object:
    """Every slot of ``det``, deep-copied: equal iff nothing changed."""
    return copy.deepcopy([getattr(det, name) for name in Detector.__slots__])


# --------------------------------------------------------------------------- #
# First round against the thesis (Fig. 2.6)                                   #
# --------------------------------------------------------------------------- #


def test_first_round_tests_the_first_node_of_each_cluster_fig_2_6() -> None:
    dets = network(range(8))
    for i, det in dets.items():
        firsts = [FIG_2_6[i][s][0] for s in range(3)]
        assert sorted(probes(det.tick(0.0))) == sorted(firsts)
        assert det.monitored() == tuple(sorted(firsts))  # dense cube: D_i == P_i


@pytest.mark.parametrize("tester", range(8))
def test_a_dead_first_node_is_suspected_and_the_next_one_tested_same_tick(tester: int) -> None:
    dets = network(range(8))
    dead = FIG_2_6[tester][2][0]  # first node of c(tester, 3)
    first = dets[tester].tick(0.0)
    pump(dets, tester, first, 0.0, drop={dead})
    outs = dets[tester].tick(1.0)
    assert Suspected(dead, 1) in outs
    # the next node of c(tester, 3) in the thesis' order is tested in the same tick
    assert FIG_2_6[tester][2][1] in probes(outs)
    assert dets[tester].suspected() == {dead}


def test_round_trip_syncs_state_and_answers_the_check() -> None:
    dets = network(range(8))
    out = pump(dets, 0, dets[0].tick(0.0), 0.0, drop=set())
    assert out == {i: [] for i in range(8)}
    assert dets[0].suspected() == frozenset()
    assert dets[0].stats.probes == 3
    assert dets[0].stats.checks == 3
    assert {dets[i].stats.replies for i in (1, 2, 4)} == {1}


# --------------------------------------------------------------------------- #
# Suspicion, correction, restart, self-suspicion                               #
# --------------------------------------------------------------------------- #


def suspect_by_timeout(dets: dict[int, Detector], a: int, b: int) -> list[DetectorOutput]:
    """``a`` probes at 0, everyone but ``b`` answers, ``a`` ticks again at 1."""
    outs = dets[a].tick(0.0)
    assert b in probes(outs)
    pump(dets, a, outs, 0.0, drop={b})
    assert events(dets[a].tick(0.3)) == []  # younger than the timeout: still pending
    return dets[a].tick(1.0)


def test_crashed_node_is_suspected_after_timeout() -> None:
    dets = network([10, 11])
    a = dets[10]
    outs = suspect_by_timeout(dets, 10, 11)
    assert events(outs) == [Suspected(11, 1)]
    assert a.entry(11) == (1, 1)
    assert a.suspected() == {11}
    assert a.correct() == {10}
    assert probes(outs) == []  # nothing correct left to test
    assert a.stats.timeouts == 1


def test_second_attempt_before_suspicion() -> None:
    a = Detector(10, 1, config=DetectorConfig(attempts=2))
    a.join(11, 1, 0.0)
    assert probes(a.tick(0.0)) == [11]
    retry = a.tick(1.0)  # first probe unanswered: probe again, no suspicion yet
    assert probes(retry) == [11]
    assert events(retry) == []
    assert events(a.tick(2.0)) == [Suspected(11, 1)]


def test_an_answered_retry_prevents_the_suspicion() -> None:
    a = Detector(10, 1, config=DetectorConfig(attempts=2))
    a.join(11, 1, 0.0)
    a.tick(0.0)
    a.tick(1.0)
    a.heard(11, 1.5)
    assert events(a.tick(2.0)) == []
    assert a.suspected() == frozenset()


def test_a_stalled_driver_gives_its_probes_time_instead_of_accusing() -> None:
    """Lifeguard's rule: after a stall, answers may be unread in the node's own
    sockets, so every unanswered probe gets half a timeout from the resume."""
    cfg = DetectorConfig(timeout=1.0, attempts=1)
    a = Detector(10, 1, config=cfg)
    a.join(11, 1, 0.0)
    a.join(12, 1, 0.0)
    assert probes(a.tick(0.0)) == [11, 12]
    a.heard(12, 0.5)  # 12 answered before the stall: nothing to move
    assert a.resumed(4.0) == 1  # the driver did not run from ~1.0 to 4.0
    assert events(a.expire(4.0)) == []  # without resumed: Suspected(11, 1) here
    a.heard(11, 4.1)  # its answer, read once the node runs again
    assert events(a.expire(4.5)) == []
    assert a.suspected() == frozenset()
    b = Detector(10, 1, config=cfg)
    b.join(11, 1, 0.0)
    b.tick(0.0)
    assert b.resumed(0.2) == 0  # a probe younger than half a timeout keeps its deadline
    assert b.resumed(4.0) == 1
    assert events(b.expire(4.5)) == [Suspected(11, 1)]  # still silent: suspected after all


def test_no_suspicion_if_heard_after_the_probe_left() -> None:
    a, _ = network([10, 11]).values()
    a.tick(0.0)
    a.heard(11, 0.2)  # data traffic: a sign of life
    assert events(a.tick(1.0)) == []
    assert a.suspected() == frozenset()


def test_wrong_suspicion_is_corrected_and_the_correction_spreads() -> None:
    dets = network([0, 1, 2])
    a, b, c = dets[0], dets[1], dets[2]
    first = a.tick(0.0)
    probe = next(o for o in first if isinstance(o, SendDetector) and o.dest == 1)
    pump(dets, 0, first, 0.0, drop={1})
    assert events(a.tick(1.0)) == [Suspected(1, 1)]  # b's answer is late
    # c pulls from a (c(2, 2) = [0, 1]) and learns the suspicion
    seen = pump(dets, 2, c.tick(1.0), 1.0, drop={1})
    assert Suspected(1, 1) in seen[2]
    # the late reply arrives: b is heard from, so a corrects it
    reply = b.receive(0, probe.msg, 1.1)
    assert isinstance(reply[0], SendDetector)
    assert events(a.receive(1, reply[0].msg, 1.2)) == [Corrected(1, 1)]
    assert a.entry(1) == (1, 2)
    # the correction spreads like any entry (c's next pull: it heard a at 1.0
    # showing the version it holds, so it skips 2.0 and pulls at 3.0)
    assert probes(c.tick(2.0)) == []
    seen = pump(dets, 2, c.tick(3.0), 3.0, drop={1})
    assert Corrected(1, 1) in seen[2]
    assert c.entry(1) == (1, 2)


def test_heard_corrects_a_suspected_node() -> None:
    dets = network([10, 11])
    a = dets[10]
    suspect_by_timeout(dets, 10, 11)
    assert events(a.heard(11, 1.5)) == [Corrected(11, 1)]
    assert a.correct() == {10, 11}


def test_restart_supersedes_the_old_incarnation() -> None:
    dets = network([0, 1, 2])
    a, c = dets[0], dets[2]
    suspect_by_timeout(dets, 0, 1)
    reborn = Detector(1, 2)
    for j in (0, 2):
        reborn.join(j, 1, 2.0)
    dets[1] = reborn
    seen = pump(dets, 1, reborn.tick(2.0), 2.0, drop={2})
    assert Restarted(1, 1, 2) in seen[0]
    assert a.entry(1) == (2, 0)
    assert 1 in a.correct()
    # a stale message of the old incarnation is ignored: no answer, no change
    before = state(a)
    stale = Probe(round=9, incarnation=1, version=0, target=1, since=0)
    assert a.receive(1, stale, 2.5) == []
    assert state(a) == before
    # the restart spreads: c learns it from a without hearing from node 1
    assert c.entry(1) == (1, 0)
    pump(dets, 2, c.tick(3.0), 3.0, drop={1})
    assert c.entry(1) == (2, 0)
    # discovery can also announce it
    assert events(a.join(1, 3, 4.0)) == [Restarted(1, 2, 3)]
    assert a.join(1, 3, 4.0) == []


def test_restart_of_a_suspected_node_via_entry_reports_both() -> None:
    a = Detector(0, 1)
    a.join(5, 1, 0.0)
    a.join(6, 1, 0.0)
    msg = Reply(round=0, incarnation=1, version=3, entries=(Entry(5, 2, 1),))
    assert events(a.receive(6, msg, 0.0)) == [Restarted(5, 1, 2), Suspected(5, 2)]


def test_node_learns_it_was_suspected_and_refutes() -> None:
    b = Detector(1, 1)
    b.join(0, 1, 0.0)
    gossip = Reply(round=0, incarnation=1, version=7, entries=(Entry(1, 1, 1),))
    assert events(b.receive(0, gossip, 0.5)) == [SelfSuspected(1, 1)]
    assert b.entry(1) == (1, 2)  # refuted: the next even counter
    # the refutation is stamped, so it goes out in the next answer
    answer = b.receive(0, Probe(round=1, incarnation=1, version=0, target=1, since=7), 0.6)
    assert isinstance(answer[0], SendDetector)
    assert isinstance(answer[0].msg, Reply)
    assert Entry(1, 1, 2) in answer[0].msg.entries
    # the driver restarts the upper layers as a new incarnation
    assert events(b.reincarnate(2, 1.0)) == []
    assert b.incarnation == 2
    assert b.entry(1) == (2, 0)
    with pytest.raises(DetectorError):
        b.reincarnate(2, 1.0)


def test_node_learns_it_was_suspected_through_the_network() -> None:
    dets = network([0, 1])
    b = dets[1]
    suspect_by_timeout(dets, 0, 1)
    # b pulls from a: a hears b (corrects it) and b reads its own higher counter
    seen = pump(dets, 1, b.tick(1.5), 1.5, drop=set())
    assert seen[0] == [Corrected(1, 1)]
    assert seen[1] == [SelfSuspected(1, 2)]


def test_newer_incarnation_of_my_own_id_is_reported() -> None:
    b = Detector(1, 1)
    b.join(0, 1, 0.0)
    msg = Reply(round=0, incarnation=1, version=1, entries=(Entry(1, 4, 0),))
    assert events(b.receive(0, msg, 0.0)) == [SelfSuspected(4, 0)]
    assert b.entry(1) == (1, 0)


def test_join_and_leave() -> None:
    a = Detector(0, 1)
    assert a.join(3, 1, 0.0) == [Joined(3, 1)]
    assert a.join(3, 1, 0.0) == []
    assert a.leave(3, 0, 0.0) == []  # older incarnation: stale announcement
    assert a.leave(3, 1, 0.0) == [Left(3, 1)]
    assert a.entry(3) is None
    assert a.monitored() == ()
    # entries about a node that left are ignored (no resurrection by gossip)
    a.join(5, 1, 0.0)
    a.receive(5, Reply(round=0, incarnation=1, version=1, entries=(Entry(3, 1, 1),)), 0.0)
    assert a.entry(3) is None
    with pytest.raises(DetectorError):
        a.join(0, 2, 0.0)
    # a suspected node that leaves, a restart of a suspected node: the sorted
    # copy of the correct set follows
    a.join(6, 1, 0.0)
    a.receive(5, Reply(round=0, incarnation=1, version=2, entries=(Entry(6, 1, 1),)), 0.0)
    assert a.suspected() == {6}
    a.leave(6, 1, 0.0)
    a.join(7, 1, 0.0)
    a.receive(5, Reply(round=0, incarnation=1, version=3, entries=(Entry(7, 1, 1),)), 0.0)
    a.join(7, 2, 0.0)
    assert a._correct == sorted(a.correct()) == [0, 5, 7]


# --------------------------------------------------------------------------- #
# Traffic as a sign of life                                                    #
# --------------------------------------------------------------------------- #


def test_heard_with_current_version_suppresses_the_probe() -> None:
    dets = network([0, 1])
    a, b = dets[0], dets[1]
    pump(dets, 0, a.tick(0.0), 0.0, drop=set())  # a now holds b's version
    a.heard(1, 0.5, version=b.version)
    assert probes(a.tick(1.0)) == []
    a.heard(1, 1.5)  # traffic without a version: the state may have changed
    second = a.tick(2.0)
    assert probes(second) == [1]
    pump(dets, 0, second, 2.0, drop=set())
    a.receive(1, Probe(round=5, incarnation=1, version=b.version + 1, target=1, since=0), 2.5)
    assert probes(a.tick(3.0)) == [1]  # heard, but with a newer version


def test_designated_node_is_checked_by_traffic_and_probed_only_when_silent() -> None:
    # ids 0, 2, 3: c(0, 2) = [2, 3]; 0 pulls from 2, and is the first node of
    # c(3, 2) = [0] (1 is absent), so 0 is 3's designated tester.
    dets = network([0, 2, 3])
    a = dets[0]
    assert a.monitored() == (2, 3)
    first = a.tick(0.0)
    assert probes(first) == [2]  # 3 gets a round to show up
    pump(dets, 0, first, 0.0, drop=set())
    a.heard(3, 0.5)
    assert probes(a.tick(1.0)) == []  # 2 answered, 3 was heard from
    assert probes(a.tick(2.0)) == [2, 3]  # both silent for a whole interval


# --------------------------------------------------------------------------- #
# Bad input                                                                    #
# --------------------------------------------------------------------------- #

GOOD_PROBE = Probe(round=1, incarnation=1, version=0, target=1, since=0)
BAD_MESSAGES: list[tuple[int, object]] = [
    (1, object()),
    (1, "probe"),
    (1, Probe(round=-1, incarnation=1, version=0, target=1, since=0)),
    (1, Probe(round=1, incarnation=1.0, version=0, target=1, since=0)),  # type: ignore[arg-type]
    (1, Probe(round=True, incarnation=1, version=0, target=1, since=0)),
    (1, Probe(round=1, incarnation=1, version=0, target=1, since=2**64)),
    (1, Reply(round=1, incarnation=1, version=0, entries=(Entry(-3, 1, 1),))),
    (1, Reply(round=1, incarnation=1, version=0, entries=(Entry(2, 1, "1"),))),  # type: ignore[arg-type]
    (1, Reply(round=1, incarnation=1, version=0, entries=[Entry(2, 1, 1)])),  # type: ignore[arg-type]
    (1, Reply(round=1, incarnation=1, version=0, entries=(Entry(2, 1, 1), Entry(2, 1, 3)))),
    (1, Reply(round=1, incarnation=1, version=0, entries=(Entry(2, 1, 1),) * 5)),
    (1, Reply(round=1, incarnation=1, version=0, entries=((2, 1, 1),))),  # type: ignore[arg-type]
    (1, Push(incarnation=1, version=-1)),
    (1, Push(incarnation=1, version=0, entries=(Entry(2, 1, 1),) * 5)),
    (1, Push(incarnation=1, version=0, entries=(Entry(2, 1, 1), Entry(2, 1, 3)))),
    (1, Push(incarnation=1, version=0, entries=[Entry(2, 1, 1)])),  # type: ignore[arg-type]
    (0, GOOD_PROBE),  # from myself
    (-1, GOOD_PROBE),
]


@pytest.mark.parametrize(("sender", "msg"), BAD_MESSAGES)
def test_bad_input_is_rejected_without_state_change(sender: int, msg: object) -> None:
    cfg = DetectorConfig(max_entries=4)
    dets = {i: Detector(i, 1, config=cfg) for i in range(4)}
    for d in dets.values():
        for j in range(4):
            if j != d.me:
                d.join(j, 1, 0.0)
    a = dets[0]
    pump(dets, 0, a.tick(0.0), 0.0, drop={3})
    before = state(a)
    with pytest.raises(RemoteDetectorError):
        a.receive(sender, msg, 0.5)  # type: ignore[arg-type]
    assert state(a) == before


@pytest.mark.parametrize(
    "obj",
    [
        None,
        [],
        [7, 1, 1, 0, 1, 0],
        [0, 1, 1, 0, 1],
        [1.0, 1, 1, 0, []],
        [True, 1, 1, 0, 1, 0],
        [0, 1, 1, 0, 1, -1],
        [1, 1, 1, 0, [1, 2]],
        [1, 1, 1, 0, [1, 2, 3] * 5],
        [1, 1, 1, 0, "abc"],
        [2, 1, 0],
        [2, 1, 0, [1, 2]],
        [2, 1, 0, [1, 2, 3] * 5],
        [2, 1, 0, [1, 2, 3], 4],
        [2, 1, -1, []],
        {"kind": 0},
    ],
)
def test_decode_rejects_garbage(obj: object) -> None:
    with pytest.raises(RemoteDetectorError):
        decode_detector(obj, max_entries=4)


def test_errors_derive_from_vcube_error() -> None:
    assert issubclass(RemoteDetectorError, DetectorError)
    assert issubclass(DetectorError, VCubeError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"interval": 0},
        {"interval": math.inf},
        {"timeout": -1.0},
        {"timeout": True},
        {"max_entries": 0},
        {"max_entries": 2.0},
        {"attempts": 0},
        {"push": 1},
    ],
)
def test_config_is_validated(kwargs: dict[str, object]) -> None:
    with pytest.raises(DetectorError):
        DetectorConfig(**kwargs)  # type: ignore[arg-type]


def test_local_misuse_raises() -> None:
    a = Detector(0, 1)
    a.tick(5.0)
    with pytest.raises(DetectorError):
        a.tick(4.0)
    with pytest.raises(DetectorError):
        Detector(-1, 0)
    with pytest.raises(DetectorError):
        a.heard(3, 5.0, version=-2)
    assert a.heard(3, 5.0) == []  # unknown node: nothing to do


# --------------------------------------------------------------------------- #
# Properties of the core                                                       #
# --------------------------------------------------------------------------- #

UINT = st.integers(0, vcube.MAX_ID)
ENTRY = st.builds(Entry, UINT, UINT, UINT)
MESSAGES = st.one_of(
    st.builds(Probe, round=UINT, incarnation=UINT, version=UINT, target=UINT, since=UINT),
    st.builds(
        Reply,
        round=UINT,
        incarnation=UINT,
        version=UINT,
        entries=st.lists(ENTRY, max_size=6, unique_by=lambda e: e.node).map(tuple),
    ),
    st.builds(
        Push,
        incarnation=UINT,
        version=UINT,
        entries=st.lists(ENTRY, max_size=6, unique_by=lambda e: e.node).map(tuple),
    ),
)


@given(MESSAGES)
def test_wire_round_trip_and_size(msg: Probe | Reply | Push) -> None:
    wire = encode_detector(msg)
    assert decode_detector(wire) == msg
    assert cbor_size(wire) == len(cbor2.dumps(wire)) == message_size(msg)


@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(2, 40),
    bits=st.integers(6, 64),
    suspect_mask=st.integers(0, 2**40 - 1),
)
def test_monitored_nodes_follow_the_vcube_rules(
    seed: int, n: int, bits: int, suspect_mask: int
) -> None:
    """``monitored() == P | D``: P = FIRSTCHILD(me, s) over the believed-correct
    nodes, D = the nodes j with FIRSTCHILD(j, CLUSTER(j, me)) == me."""
    ids = sparse_ids(random.Random(seed), n, max(bits, n.bit_length()))
    me, gossip = ids[0], ids[1]
    suspects = [j for k, j in enumerate(ids[2:]) if suspect_mask >> k & 1]
    det = Detector(me, 1)
    for j in ids[1:]:
        det.join(j, 1, 0.0)
    entries = tuple(Entry(j, 1, 1) for j in suspects)
    det.receive(gossip, Reply(round=0, incarnation=1, version=1, entries=entries), 0.0)
    cube = Hypercube(set(ids) - set(suspects))
    firsts = (cube.first_child(me, s) for s in range(1, 65))
    pulls = {c for c in firsts if c is not None}
    designated = {j for j in cube if j != me and cube.first_child(j, cluster(j, me)) == me}
    assert det.monitored() == tuple(sorted(pulls | designated))


@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 60))
def test_entries_only_grow_and_changes_bump_the_version(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    ids = list(range(6))
    det = network(ids)[0]
    for _ in range(steps):
        before = {j: det.entry(j) for j in ids}
        version = det.version
        sender = rng.randrange(1, 6)
        inc = rng.randrange(1, 3)
        picked = rng.sample(ids, rng.randrange(0, 4))
        ents = tuple(Entry(j, rng.randrange(1, 3), rng.randrange(0, 5)) for j in picked)
        det.receive(sender, Reply(round=0, incarnation=inc, version=0, entries=ents), 0.0)
        after = {j: det.entry(j) for j in ids}
        assert all(after[j] >= before[j] for j in ids)  # type: ignore[operator]
        assert (after != before) == (det.version > version)
        assert det._correct == sorted(det.correct())  # the sorted copy kept in step


# --------------------------------------------------------------------------- #
# Properties of a network of detectors (p2p.sim._detsim)                         #
# --------------------------------------------------------------------------- #


@given(
    n=st.integers(2, 64),
    seed=st.integers(0, 2**32 - 1),
    crash_pick=st.integers(0, 2**16),
    width=st.sampled_from([0, 1, 2, 8, 64]),
    delay_permille=st.integers(1, 240),
    attempts=st.integers(1, 2),
)
def test_completeness_accuracy_and_tests_per_round(
    n: int, seed: int, crash_pick: int, width: int, delay_permille: int, attempts: int
) -> None:
    """Random sparse ids, a random crash set (at least one node stays correct),
    no loss, one-way delays uniform in ``[0, delta]`` with ``delta < timeout / 2``
    (so every round trip is below the timeout).  Asserted:

    1. completeness: every correct node suspects every crashed node within
       ``B + 2 + delta * (2B + 1)`` rounds of the crash, ``B = ceil(log2 N)^2``
       (the published bound).  The +2: the crashed node's last message vouches
       for it until the checker's next tick (one round), and a probe expires
       only at the tick after it left (one round, ``timeout <= interval``); the
       delay term: that last message may arrive ``delta`` after the crash, and
       each of at most ``B`` pulls carrying the news may add a round trip.
       Each extra probe ``attempts`` adds one round.
    2. accuracy: no correct node is ever suspected, even 3 rounds after the end.
    3. tests per round: at most ``2T`` probes in every round, where ``T`` is
       the number of non-empty (node, cluster) pairs (``N log2 N`` for a dense
       cube): each pull uses its prober's pair, each designated check the
       target's pair, and accuracy leaves one designated tester per pair.
       Round 0 (nothing heard yet) sends exactly ``T``.  ``T`` itself can exceed
       ``N ceil(log2 N)`` for sparse ids (ids 0, 1, 2, 4: T = 9 > 8).
    """
    bits = {0: (n - 1).bit_length(), 1: (n - 1).bit_length() + 1, 2: 8}.get(width, width)
    bits = max(bits, (n - 1).bit_length())
    rng = random.Random(seed)
    ids = sparse_ids(rng, n, bits)
    dead = rng.sample(ids, 1 + crash_pick % (n - 1))
    delta = delay_permille / 1000
    note(f"replay: n={n} seed={seed} crash_pick={crash_pick} width={width} delta={delta}")
    cfg = DetectorConfig(attempts=attempts)
    out, net = run_crash(ids, dead, rng, config=cfg, delays=Delays(low=0.0, high=delta))
    bound = math.ceil(math.log2(n)) ** 2
    assert out.complete
    assert max(out.latencies) <= bound + 1 + attempts + delta * (2 * bound + 1)
    net.run_until(net.now + 3 * net.config.interval)
    assert net.record.false_suspicions == []
    assert net.knows_all(dead)
    t = nonempty_clusters(ids)
    assert out.probes[0] == t
    assert max(out.probes.values()) <= 2 * t


@pytest.mark.parametrize("d", [3, 4, 5])
def test_dense_cube_checks_n_log_n_per_round(d: int) -> None:
    """Dense ids ``0..2^d-1``: every node checks exactly its ``d`` hypercube
    neighbours, so ``N log2 N`` checks per round and never more probes."""
    n = 1 << d
    out, _ = run_crash(range(n), [n - 1], random.Random(d), warmup=6)
    assert nonempty_clusters(range(n)) == n * d
    assert all(out.checks[r] == n * d for r in range(6))
    assert max(out.probes.values()) == n * d
    assert out.complete
    assert out.worst_rounds <= d * d + 2


def test_data_traffic_replaces_probes_when_nothing_changes() -> None:
    """One data frame per round on every monitored link, carrying the version:
    probes only where delay jitter left a whole interval without a frame."""
    ids = sparse_ids(random.Random(5), 32)
    _, net = run_crash(ids, [ids[0]], random.Random(5), data=True, warmup=6)
    steady = sum(net.record.probes[r] for r in range(2, 6))
    assert steady <= 0.02 * 4 * nonempty_clusters(ids)
    assert net.knows_all([ids[0]])


# --------------------------------------------------------------------------- #
# Pushes down the broadcast tree, expiry at deadlines, the transport's hint    #
# --------------------------------------------------------------------------- #


def pushes(outs: list[DetectorOutput]) -> list[SendDetector]:
    """The pushes in ``outs``."""
    return [o for o in outs if isinstance(o, SendDetector) and isinstance(o.msg, Push)]


def test_suspicion_is_pushed_down_the_broadcast_tree_once_to_every_node() -> None:
    dets = network(range(8))
    for i in range(8):  # everyone syncs once, so only the push can carry news
        pump(dets, i, dets[i].tick(0.0), 0.0, drop=set())
    a = dets[0]
    outs = a.tick(1.0)
    pump(dets, 0, outs, 1.0, drop={7})  # 7 is probed by nobody here: probe it by hand
    outs = a.probe_now(7, 1.1)
    assert probes(outs) == [7]
    sent = {i: d.stats.pushes for i, d in dets.items()}
    outs = a.expire(1.6)
    assert events(outs) == [Suspected(7, 1)]
    # the root sends to its first correct node of each cluster: 1, 2 and 4
    assert sorted(o.dest for o in pushes(outs)) == [1, 2, 4]
    seen = pump(dets, 0, outs, 1.6, drop={7})
    assert all(Suspected(7, 1) in seen[i] for i in range(1, 7))
    assert all(dets[i].suspected() == {7} for i in range(7))
    # one message per node reached: 6 edges of the tree over the 7 correct nodes
    assert sum(d.stats.pushes - sent[i] for i, d in dets.items()) == 6
    # node 4 received it at level 3 and forwarded within c(4, 1), c(4, 2): to 5 and 6
    assert dets[4].stats.pushes - sent[4] == 2


def test_push_is_merged_like_a_reply_and_only_newer_entries_count() -> None:
    a = Detector(0, 1)
    for j in (1, 2, 3):
        a.join(j, 1, 0.0)
    push = Push(incarnation=1, version=9, entries=(Entry(2, 1, 1), Entry(5, 1, 1)))
    outs = a.receive(1, push, 0.5)
    assert events(outs) == [Suspected(2, 1), Reported(5, 1)]  # 5: reported, once
    assert a.entry(5) is None  # not a member: membership is the driver's
    # forwarded below CLUSTER(0, 1) = 1: nowhere (no cluster below level 1)
    assert pushes(outs) == []
    before = state(a)
    assert events(a.receive(3, push, 0.6)) == []  # a duplicate changes nothing
    after = state(a)
    assert after != before  # (only the sign of life of node 3 was recorded)
    assert a.entry(2) == (1, 1)


def test_a_reported_suspicion_goes_on_in_answers_to_pulls() -> None:
    """A suspicion of a node this detector never knew is kept and stamped, so
    a pull passes it on to a node that does know it (one that learnt of it
    from a peer record alone may pull only from nodes like this one); it is
    reported once per incarnation, and a join starts the node afresh."""
    a = Detector(0, 1)
    a.join(1, 1, 0.0)
    outs = a.receive(1, Push(incarnation=1, version=9, entries=(Entry(5, 1, 1),)), 0.5)
    assert events(outs) == [Reported(5, 1)]
    assert a.entry(5) is None  # still not a member here
    probe = Probe(round=1, incarnation=1, version=0, target=a.incarnation, since=0)
    reply = a.receive(1, probe, 0.6)[0]
    assert isinstance(reply, SendDetector)
    assert isinstance(reply.msg, Reply)
    assert Entry(5, 1, 1) in reply.msg.entries
    newer = Push(incarnation=1, version=10, entries=(Entry(5, 1, 3),))
    assert events(a.receive(1, newer, 0.7)) == []  # the same incarnation: reported once
    later = a.receive(1, Probe(round=2, incarnation=1, version=0, target=1, since=0), 0.8)
    assert isinstance(later[0], SendDetector)
    assert isinstance(later[0].msg, Reply)
    assert Entry(5, 1, 3) in later[0].msg.entries
    assert events(a.join(5, 2, 0.9)) == [Joined(5, 2)]
    assert a.entry(5) == (2, 0)


def test_push_off_disseminates_by_pulls_only() -> None:
    cfg = DetectorConfig(push=False)
    a = Detector(10, 1, config=cfg)
    a.join(11, 1, 0.0)
    a.join(12, 1, 0.0)
    a.tick(0.0)
    a.receive(12, Reply(round=1, incarnation=1, version=1), 0.1)
    outs = a.tick(1.0)
    assert Suspected(11, 1) in outs
    assert pushes(outs) == []
    assert pushes(a.receive(12, Push(incarnation=1, version=2, entries=()), 2.1)) == []


def test_own_findings_are_pushed_merged_ones_are_not() -> None:
    a = Detector(0, 1)
    a.join(1, 1, 0.0)
    a.join(2, 1, 0.0)
    # merged from a reply: no push of our own
    outs = a.receive(1, Reply(round=0, incarnation=1, version=1, entries=(Entry(2, 1, 1),)), 0.1)
    assert pushes(outs) == []
    # a correction we make (2 is heard from): pushed
    outs = a.heard(2, 0.2)
    assert events(outs) == [Corrected(2, 1)]
    assert {o.dest for o in pushes(outs)} == {1, 2}
    assert all(o.msg.entries == (Entry(2, 1, 2),) for o in pushes(outs))  # type: ignore[union-attr]
    # a refutation (we read our own suspicion): pushed; a restart we learn: pushed
    outs = a.receive(1, Reply(round=0, incarnation=1, version=2, entries=(Entry(0, 1, 1),)), 0.3)
    assert Entry(0, 1, 2) in pushes(outs)[0].msg.entries  # type: ignore[union-attr]
    outs = a.join(1, 2, 0.4)
    assert Entry(1, 2, 0) in pushes(outs)[0].msg.entries  # type: ignore[union-attr]


def test_expiry_at_the_deadline_keeps_attempts_and_timeout() -> None:
    """Each attempt waits exactly ``timeout``; the suspicion needs them all."""
    a = Detector(10, 1, config=DetectorConfig(timeout=0.3, attempts=3))
    a.join(11, 1, 0.0)
    assert a.deadline() is None
    assert probes(a.tick(0.0)) == [11]
    assert a.deadline() == pytest.approx(0.3)
    assert a.expire(0.29) == []
    for k in (1, 2):
        retry = a.expire(0.3 * k)
        assert probes(retry) == [11]
        assert events(retry) == []
        assert a.deadline() == pytest.approx(0.3 * (k + 1))
    assert events(a.expire(0.9)) == [Suspected(11, 1)]
    assert a.deadline() is None


def test_traffic_reported_when_the_probe_leaves_does_not_answer_it() -> None:
    """A frame reported at the probe's own send time arrived before it (the
    runtime reports what it heard, then probes): it is no answer."""
    a = Detector(10, 1)
    a.join(11, 1, 0.0)
    a.tick(0.0)
    a.heard(11, 0.2)  # answers the probe of 0.0
    a.heard(11, 1.0)  # reported at 1.0, then the tick of 1.0 probes (no version seen)
    assert probes(a.tick(1.0)) == [11]
    assert events(a.expire(1.5)) == [Suspected(11, 1)]


def test_transport_hint_probes_at_once_and_only_a_timeout_suspects() -> None:
    dets = network([10, 11, 12])
    a = dets[10]
    pump(dets, 10, a.tick(0.0), 0.0, drop=set())
    # the hint between two ticks: a probe leaves now
    outs = a.probe_now(11, 0.4)
    assert probes(outs) == [11]
    assert a.probe_now(11, 0.41) == []  # an unanswered probe is out: it counts
    assert a.deadline() == pytest.approx(0.9)
    # the peer answers: no suspicion, nothing pending
    pump(dets, 10, outs, 0.42, drop=set())
    assert a.deadline() is None
    assert events(a.expire(0.9)) == []
    # a peer that answers with traffic only (no reply): no suspicion either
    outs = a.probe_now(12, 1.2)
    assert probes(outs) == [12]
    a.heard(12, 1.3)
    assert probes(a.probe_now(12, 1.4)) == [12]  # the answered probe is replaced
    a.heard(12, 1.5)
    assert events(a.expire(1.9)) == []
    assert a.suspected() == frozenset()
    # a silent peer: suspected at the probe's deadline, not at the hint
    outs = a.probe_now(11, 2.2)
    assert events(outs) == []
    assert events(a.expire(2.7)) == [Suspected(11, 1)]
    # no probe for a suspected, unknown or own id
    assert a.probe_now(11, 2.8) == []
    assert a.probe_now(99, 2.8) == []
    assert a.probe_now(10, 2.8) == []
    with pytest.raises(DetectorError):
        a.probe_now(-1, 2.8)


def tree_depth(ids: Iterable[int]) -> int:
    """Deepest VCube broadcast tree over ``ids``, over every root."""
    cube = Hypercube(ids)
    return max(depth_and_degree(cube.tree(r), r)[0] for r in cube)


@given(
    n=st.integers(2, 64),
    seed=st.integers(0, 2**32 - 1),
    width=st.sampled_from([0, 1, 8, 64]),
    delay_permille=st.integers(1, 240),
    attempts=st.integers(1, 2),
    hint=st.booleans(),
)
def test_pushed_crash_reaches_every_node_within_one_tree_walk(
    n: int, seed: int, width: int, delay_permille: int, attempts: int, hint: bool
) -> None:
    """One crash, no loss, one-way delays in ``[0, delta]``: every correct node
    suspects it within ``2 + (delta + attempts * timeout + depth * delta) / interval``
    rounds, ``depth`` the deepest broadcast tree of the live nodes: the first
    unanswered probe leaves within two rounds of the crashed node's last
    message (which arrives ``delta`` after the crash), expires after
    ``attempts`` timeouts, and the push walks the origin's tree.  With the
    transport's hint ``h`` after the crash (modelled after the crashed node's
    last message arrived, as a connection's end follows what was sent on it):
    ``h + attempts * timeout`` plus the walk.  Against the pull-only bound
    ``B + 1 + attempts + delta (2B + 1)`` (``B = ceil(log2 N)^2``): for one
    attempt and ``delta = 0.1``, about 3 rounds instead of 12.9 (N = 8) or 45.3
    (N = 64)."""
    bits = {0: (n - 1).bit_length(), 1: (n - 1).bit_length() + 1}.get(width, width)
    bits = max(bits, (n - 1).bit_length())
    rng = random.Random(seed)
    ids = sparse_ids(rng, n, bits)
    dead = [rng.choice(ids)]
    delta = delay_permille / 1000
    note(f"replay: n={n} seed={seed} width={width} delta={delta} hint={hint}")
    cfg = DetectorConfig(attempts=attempts)
    h = delta + 0.01
    out, net = run_crash(
        ids, dead, rng, config=cfg, delays=Delays(low=0.0, high=delta), hint=h if hint else None
    )
    depth = tree_depth([i for i in ids if i not in dead]) if n > 2 else 0
    first = h if hint else 2 + delta
    bound = first + attempts * cfg.timeout + depth * delta
    assert out.complete
    assert max(out.latencies) <= bound + 1e-6
    net.run_until(net.now + 3 * net.config.interval)
    assert net.record.false_suspicions == []


@given(
    n=st.integers(3, 48),
    seed=st.integers(0, 2**32 - 1),
    crash_pick=st.integers(0, 2**16),
    loss_percent=st.sampled_from([30, 70, 100]),
)
def test_lost_pushes_still_converge_by_pulls(
    n: int, seed: int, crash_pick: int, loss_percent: int
) -> None:
    """Pushes lost at random (all of them at 100 %): pulls still deliver every
    suspicion within the pull-only bound, and nobody correct is suspected."""
    rng = random.Random(seed)
    ids = sparse_ids(rng, n)
    dead = rng.sample(ids, 1 + crash_pick % (n - 1))
    note(f"replay: n={n} seed={seed} crash_pick={crash_pick} loss={loss_percent}")
    delta = 0.01
    out, net = run_crash(
        ids, dead, rng, delays=Delays(low=0.0, high=delta), push_loss=loss_percent / 100
    )
    bound = math.ceil(math.log2(n)) ** 2
    assert out.complete
    assert max(out.latencies) <= bound + 2 + delta * (2 * bound + 1)
    assert net.record.false_suspicions == []


def test_pushes_are_much_faster_than_pulls_alone() -> None:
    """The same crash with every push lost takes rounds per tree level; with
    pushes, the tree walk takes milliseconds (a test that fails without them)."""
    ids = sparse_ids(random.Random(3), 128)
    worst = {}
    for loss in (0.0, 1.0):
        out, _ = run_crash(ids, [ids[5]], random.Random(3), delays=Delays(), push_loss=loss)
        assert out.complete
        worst[loss] = max(out.latencies) - min(out.latencies)
    assert worst[0.0] < 0.1  # every node within 0.1 round of the first suspicion
    assert worst[1.0] > 2  # pulls: several rounds up the trees


@given(
    n=st.integers(2, 32),
    seed=st.integers(0, 2**32 - 1),
    spike_permille=st.integers(500, 990),
)
def test_no_false_suspicion_if_round_trips_stay_below_attempts_timeouts(
    n: int, seed: int, spike_permille: int
) -> None:
    """Accuracy with ``attempts = 2`` under delay spikes: one-way delays up to
    ``0.99 timeout``, so a round trip can exceed one timeout but not two.  A
    late answer to the first attempt arrives within the second attempt, and
    any message answers it: no correct node is suspected, pushes or not."""
    rng = random.Random(seed)
    ids = sparse_ids(rng, n)
    cfg = DetectorConfig(attempts=2)
    spike = cfg.timeout * spike_permille / 1000
    delays = Delays(low=0.0, high=0.01, spike_prob=0.2, spike=spike)
    net = DetectorNet(ids, rng, config=cfg, delays=delays)
    net.run_until(20 * cfg.interval)
    assert net.record.false_suspicions == []
    assert net.record.self_suspicions == 0


def test_the_spike_scenario_does_suspect_with_a_single_attempt() -> None:
    """The scenario above is a real test: with one attempt, spikes above the
    timeout do make false suspicions."""
    rng = random.Random(1)
    ids = sparse_ids(rng, 16)
    cfg = DetectorConfig(attempts=1)
    delays = Delays(low=0.0, high=0.01, spike_prob=0.2, spike=0.99 * cfg.timeout)
    net = DetectorNet(ids, rng, config=cfg, delays=delays)
    net.run_until(20 * cfg.interval)
    assert net.record.false_suspicions != []

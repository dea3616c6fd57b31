"""Connection resets in the simulator (scenario action ``RESET``): the runtime's
reliable links (``p2p._reliable``'s ``SendLog``/``ReceiveLog``, driven by
``p2p.sim._links``) lose nothing when a connection between live nodes breaks.

Checked here: a publication at 500 msg/s with the publisher's and a
subscriber's connections reset every 200 u.t. reaches every subscriber
exactly once, in order, with every trace check holding; the same run with
the resend or the duplicate filter switched off fails (so the test can
fail); a run without RESET has no tracked links; ``p2p sim`` takes RESET
lines; and, as a Hypothesis property, random SUB/UNS/PUB scripts with
random resets (and crashes and recoveries) keep causal order, FIFO,
exactly-once, validity and agreement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import pytest
from _cli import sim_lines
from hypothesis import given, note, settings
from hypothesis import strategies as st
from strategies import populations, raw_steps
from test_failures import failure_scripts, run_checked

from p2p._reliable import ReceiveLog, SendLog
from p2p.cli import main
from p2p.sim import DETECTOR, Script, Simulation, check_trace, check_views, legal_script
from topics import RemoteProtocolError
from vcube import DetectorConfig

FAST = DetectorConfig(interval=200.0, timeout=300.0, attempts=2, max_timeout=2400.0)

COUNT = 1000
"""Publications of the flood: 500 msg/s (one per 2 u.t., u.t. read as ms) for 2 s."""


def _flood(seed: int, n: int = 5) -> Simulation:
    """Everyone subscribes; node 0 publishes :data:`COUNT` messages from 2000 u.t.
    on, one every 2 u.t.; every 200 u.t. a connection of the publisher breaks,
    and 100 u.t. later one of subscriber 1 (each to a rotating other end)."""
    sim = Simulation(list(range(n)), seed=seed, detector=DETECTOR)
    for k in range(n):
        sim.schedule(0.0, "SUB", k, "t")
    for j in range(COUNT):
        sim.schedule(2000.0 + 2.0 * j, "PUB", 0, "t", b"m%d" % j)
    for r in range(2 * COUNT // 200 + 2):
        at = 2000.0 + 200.0 * r + 37.0
        sim.schedule(at, "RESET", 0, str(1 + r % (n - 1)))
        sim.schedule(at + 100.0, "RESET", 1, str(2 + r % (n - 2)))
    return sim


def _delivered(sim: Simulation) -> dict[int, list[int]]:
    """Per node, the sequence numbers of node 0's publications it delivered, in order."""
    got: dict[int, list[int]] = defaultdict(list)
    for e in sim.recorder.trace:
        if e.event == "deliver" and e.source == 0:
            assert e.seq is not None
            got[e.node].append(e.seq)
    return got


def _run_with_resets(
    sim: Simulation, script: Script, resets: Sequence[tuple[float, int, int]]
) -> None:
    """Schedule ``script`` (each payload names its node and time) and the
    connection resets ``(time, node, other)``, then :func:`run_checked`."""
    for time, action, node, topic in script:
        sim.schedule(time, action, node, topic, f"{node}@{time}".encode())
    for time, node, other in resets:
        sim.schedule(time, "RESET", node, str(other))
    run_checked(sim)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_resets_during_a_flood_lose_nothing_and_duplicate_nothing(seed: int) -> None:
    sim = _flood(seed)
    run_checked(sim)  # every trace check: causal, FIFO, exactly once, validity, agreement
    published = [e.seq for e in sim.recorder.trace if e.event == "publish"]
    assert len(published) == COUNT
    for node, seqs in _delivered(sim).items():
        assert seqs == published, f"node {node} delivered out of order or not exactly once"
    assert sorted(_delivered(sim)) == list(range(5))
    links = sim.link_metrics()
    # The resets did hit traffic: frames and acks died in flight, frames went
    # again, and the receivers dropped the ones they had handled.
    assert links["resets"] == 2 * (2 * COUNT // 200 + 2), links
    assert links["frames_lost_in_flight"] > 0, links
    assert links["acks_lost"] > 0, links
    assert links["frames_resent"] > 0, links
    assert links["frames_duplicate"] > 0, links
    assert links["lost_on_disconnect"] == 0, links
    m = sim.membership_metrics()
    assert m["false_suspicions"] == 0, m  # a reset between live nodes hints nothing
    assert m["reincarnations"] == 0, m
    assert m["converged"] is True, m


def test_without_the_resend_the_flood_loses_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SendLog.unconfirmed`` is what a new connection sends again: with it
    empty, what died in flight is never delivered, and the checks say so."""
    monkeypatch.setattr(SendLog, "unconfirmed", lambda self: [])
    sim = _flood(1)
    sim.run()
    found = check_trace(sim.recorder.trace, quiescent=True) + check_views(sim)
    assert any(v.kind == "liveness" for v in found), found
    assert min(len(s) for s in _delivered(sim).values()) < COUNT


def test_without_the_duplicate_filter_a_resent_frame_is_handled_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ReceiveLog.fresh`` drops what a receiver handled before the reset:
    with every frame fresh, a resent ACK reaches the core twice."""
    monkeypatch.setattr(ReceiveLog, "fresh", lambda self, peer, link, lseq: True)
    with pytest.raises(RemoteProtocolError, match="unexpected ACK"):
        _flood(1).run()


def test_a_run_without_reset_tracks_no_link() -> None:
    sim = Simulation(list(range(4)), seed=1, detector=DETECTOR)
    sim.schedule(0.0, "SUB", 1, "t")
    sim.schedule(900.0, "PUB", 0, "t", b"x")
    sim.run()
    assert sim.link_metrics() == {}
    assert sim._links is None


def test_a_reset_to_a_crashed_peer_hints_the_detector() -> None:
    """The runtime hints its detector when the re-dial after a lost connection
    fails: node 2 crashes, node 0's connection to it resets at once, and the
    failed dial makes 0 probe 2 (its hint count rises) before any round would."""
    sim = Simulation(list(range(4)), seed=2, detector=DETECTOR)
    for k in range(4):
        sim.schedule(0.0, "SUB", k, "t")
    sim.schedule(1000.0, "PUB", 0, "t", b"a")
    sim.schedule(3000.0, "CRASH", 2, "")
    sim.schedule(3000.0, "RESET", 0, "2")
    sim.run()
    assert sim.link_metrics()["dial_failures"] >= 1
    assert sim.membership_metrics()["hints"] >= 1
    assert all(2 not in sim.machines[x].alive for x in (0, 1, 3))
    run_checked(sim)


def test_p2p_sim_takes_reset_lines(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    lines = ["0;SUB;*;news"]
    lines += [f"{1000 + 2 * k};PUB;0;news;m{k}" for k in range(300)]
    lines += [f"{1050 + 100 * k};RESET;0;{1 + k % 3}" for k in range(6)]
    lines += [f"{1100 + 100 * k};RESET;*;0" for k in range(3)]
    doc, trace = sim_lines(tmp_path, lines, 4)
    assert doc["deliveries"] == 300 * 4
    assert doc["membership"]["false_suspicions"] == 0
    assert main(["check", str(trace)]) == 0
    capsys.readouterr()


def test_a_verdict_on_an_old_life_does_not_cut_the_link_to_the_new_one() -> None:
    """Found by the property (verify profile): the reset switches the run to
    tracked links; node 7 crashes and recovers, node 8 answers its new SUB
    round on a link already re-opened to the new life, then its detector
    suspects the old life.  Dropping that link then lost the ACK in flight
    to the new life, and node 7's round never completed."""
    script = [
        (0.0, "SUB", 0, "t0"),
        (0.0, "SUB", 5, "t0"),
        (0.0, "UNS", 5, "t0"),
        (0.0, "UNS", 0, "t0"),
        (0.0, "SUB", 5, "t0"),
        (0.0, "SUB", 0, "t0"),
        (0.0, "UNS", 0, "t0"),
        (0.0, "UNS", 5, "t0"),
        (0.0, "SUB", 0, "t0"),
        (0.0, "UNS", 0, "t0"),
        (0.0, "SUB", 5, "t0"),
        (0.0, "SUB", 0, "t0"),
        (0.0, "UNS", 0, "t0"),
        (0.0, "SUB", 0, "t0"),
        (0.0, "UNS", 5, "t0"),
        (0.0, "SUB", 5, "t0"),
        (2.3, "UNS", 0, "t0"),
        (10.0, "SUB", 7, "t0"),
        (236.0, "SUB", 0, "t0"),
        (983.1, "UNS", 0, "t0"),
        (1005.4, "SUB", 0, "t0"),
        (1006.0, "UNS", 0, "t0"),
        (1060.7, "SUB", 0, "t0"),
        (1361.5, "UNS", 0, "t0"),
        (1990.7, "SUB", 0, "t0"),
        (2430.0, "CRASH", 7, ""),
        (3553.0, "RECOVER", 7, ""),
        (3553.0, "SUB", 7, "t0"),
    ]
    _run_with_resets(Simulation(list(range(9)), seed=4806, detector=FAST), script, [(0.0, 4, 0)])


def test_nothing_joins_a_frame_sent_again() -> None:
    """Found by the property (verify profile, seed 224): node 7's link to node
    6 breaks while node 6's ack of frame 15 is on its way, so frame 15 is
    sent again on the new connection; node 7 then forwards node 1's SUB to
    node 6, and the simulator's coalescer joined it to that resent frame.
    Node 6 had handled frame 15 and dropped it whole as a duplicate, with
    the SUB: node 1's round never completed.  The runtime resends a frame's
    own bytes, so nothing may join a resent frame."""
    script = [
        (0.0, "SUB", 1, "t0"), (0.0, "SUB", 7, "t0"), (0.0, "SUB", 5, "t0"),
        (0.0, "SUB", 8, "t0"), (1.0, "PUB", 7, "t0"), (3.0, "CRASH", 8, ""),
        (300.0, "UNS", 5, "t0"), (516.7, "SUB", 2, "t0"), (753.0, "SUB", 6, "t0"),
        (799.5, "SUB", 5, "t0"), (870.2, "SUB", 4, "t0"), (909.2, "UNS", 1, "t0"),
        (935.8, "SUB", 3, "t0"), (972.0, "SUB", 0, "t0"), (1597.9, "PUB", 0, "t0"),
        (1921.8, "UNS", 2, "t0"), (2294.9, "SUB", 1, "t0"), (2587.1, "UNS", 4, "t0"),
        (3093.6, "UNS", 6, "t0"), (3249.1, "CRASH", 3, ""), (4827.0, "UNS", 0, "t0"),
    ]  # fmt: skip
    resets = [(971.0, 2, 0), (4636.0, 4, 5), (5128.0, 1, 0), (5363.0, 7, 6)]
    _run_with_resets(Simulation(list(range(9)), seed=224, detector=FAST), script, resets)


# ----------------------------------------------------------------- property


def _resets(ids: list[int], most: int) -> st.SearchStrategy[list[tuple[float, int, int]]]:
    """Connection resets ``(time, node, other)`` between distinct nodes."""
    n = len(ids)
    reset = st.tuples(st.floats(0, 6000), st.integers(0, n - 1), st.integers(1, n - 1))
    return st.lists(reset.map(lambda r: (r[0], ids[r[1]], ids[(r[1] + r[2]) % n])), max_size=most)


@settings(deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), ntopics=st.integers(1, 2))
def test_guarantees_hold_under_random_resets(data: st.DataObject, seed: int, ntopics: int) -> None:
    """Random SUB/UNS/PUB scripts (with crashes, and recoveries half the time)
    and up to 40 random resets, full membership, the real detector: causal
    order, FIFO, exactly once, validity and agreement hold on the trace, the
    views agree, nothing stays held back, membership converges."""
    ids = data.draw(populations(3, 12), label="ids")
    topics = [f"t{k}" for k in range(ntopics)]
    if data.draw(st.booleans(), label="crashes"):
        recover = data.draw(st.booleans(), label="recover")
        script = data.draw(failure_scripts(ids, topics, recover=recover), label="script")
    else:
        steps = data.draw(raw_steps(ids, topics, horizon=6000, rolls=9), label="steps")
        script = legal_script(steps)
    resets = data.draw(_resets(ids, 40), label="resets")
    sim = Simulation(ids, seed=seed, detector=FAST)
    _run_with_resets(sim, script, resets)
    m = sim.membership_metrics()
    note(repr(sim.link_metrics()))
    note(repr(m))
    assert m["converged"] is True, m
    assert m["agreed"] is True, m


def test_a_run_with_resets_replays_from_its_seed() -> None:
    """Acks and re-dials draw from the run's own streams: the same seed, the
    same trace and counts; another seed, another run."""
    runs = []
    for seed in (5, 5, 6):
        sim = _flood(seed)
        sim.run()
        runs.append((repr(sim.recorder.trace), sim.link_metrics(), sim.now))
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_a_resume_is_never_answered_with_a_publication_not_yet_sent() -> None:
    """Found by the random-resets property (seed 0, no resets): node A, back as
    a new life, answered node C's RESUME with a publication still queued
    behind its SUB round, then crashed; C delivered it from the history,
    and nobody else could ever get it.  An answer now holds only
    publications whose rounds completed (``Replay.more`` for the rest)."""
    ids = [
        0,
        11_400_714_819_323_198_485,
        4_354_685_564_936_845_354,
        15_755_400_384_260_043_839,
        8_709_371_129_873_690_708,
        1_663_341_875_487_337_577,
        13_064_056_694_810_536_062,
    ]
    a, b, c = ids[1], ids[2], ids[3]
    script: list[tuple[float, str, int, str]] = [(0.0, "SUB", 0, "t0"), (0.0, "UNS", 0, "t0")] * 5
    script += [(0.0, "SUB", 0, "t0"), (0.0, "SUB", b, "t0"), (0.0, "SUB", a, "t0"),
               (0.0, "SUB", c, "t0"), (0.0, "UNS", 0, "t0"), (127.0, "PUB", a, "t0"),
               (2859.0, "CRASH", a, ""), (4179.0, "RECOVER", a, ""), (4203.0, "SUB", a, "t0"),
               (4205.0, "PUB", a, "t0"), (4378.0, "CRASH", a, "")]  # fmt: skip
    _run_with_resets(Simulation(ids, seed=0, detector=FAST), script, [])

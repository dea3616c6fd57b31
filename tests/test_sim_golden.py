"""Golden runs of the simulator: fixed scenarios and seeds, pinned outputs.

Speed work on the engine and the cores (issue 21) must not change what a run
does.  Each case runs a fixed scenario and hashes everything the recorder
saw (the full trace, the metrics, the per-link packet log, the hold-backs)
with the engine's loss counters; the digests were taken before the speed
changes.  A mismatch means behaviour changed: packet counts, delivery order,
timing or the order of random draws.  The counts are asserted too, so a
failure says what moved before one compares digests.
"""

from __future__ import annotations

import hashlib
import io
import json
import random

import pytest

from p2p.sim import DelayModel, Simulation, legal_script


def _digest(sim: Simulation, events: int) -> str:
    """A hash of everything observable about a finished run."""
    rec = sim.recorder
    trace = io.StringIO()
    rec.write_trace(trace)
    doc = {
        "metrics": rec.metrics(),
        "links": [list(map(repr, link)) for link in rec.links],
        "holds": [repr(h) for h in rec.holds],
        "refusals": rec.refusals,
        "lost": sim.lost,
        "unsent": sim.unsent,
        "now": repr(sim.now),
        "events": events,
    }
    blob = trace.getvalue() + json.dumps(doc, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _all_publish(protocol: str, aggregation: str, nodes: int, seed: int) -> tuple[Simulation, int]:
    """The benchmark's case shape (bench.sim_speed ``a``/``b``): oracle start, each
    node publishes once at a uniform time in [0, 1000]."""
    sim = Simulation(
        list(range(nodes)),
        protocol=protocol,
        aggregation=aggregation,
        delays=DelayModel(),
        seed=seed,
        record_links=True,
    )
    sim.preset_subscriptions("t", range(nodes))
    rng = random.Random(seed)
    for node in range(nodes):
        sim.schedule(rng.uniform(0.0, 1000.0), "PUB", node, "t", b"x" * 32)
    return sim, sim.run()


def _churn(seed: int, *, recover: bool) -> tuple[Simulation, int]:
    """SUB rounds, UNS, publications on two topics, crashes (and recoveries)."""
    nodes = 24
    rng = random.Random(seed)
    steps = [
        (rng.uniform(0.0, 4000.0), rng.randrange(nodes), rng.choice("ab"), rng.randrange(10))
        for _ in range(nodes * 5)
    ]
    sim = Simulation(list(range(nodes)), seed=seed, record_links=True)
    for time, action, node, topic in legal_script(
        steps, crash_roll=9, max_down=nodes // 3, recover=recover
    ):
        sim.schedule(time, action, node, topic, b"p" if action == "PUB" else b"")
    return sim, sim.run()


GOLDEN: dict[str, tuple[dict[str, int], int, str]] = {
    "causal-broadcast/on/32": ({"MSG": 942}, 1024, "34d8d7f6cd67fd17"),
    "churn/crash": ({"ACK": 1013, "PUB": 305, "SUB": 696, "UNS": 72}, 359, "4c24977c3fbe8f32"),
    "churn/recover": ({"ACK": 2143, "PUB": 783, "SUB": 1104, "UNS": 348}, 428, "09b7884c615faad1"),
    "srpt/on/32": ({"PUB": 1007}, 1024, "7fdfc4b8f2130821"),
    "vcube-ps/causal/40": ({"ACK": 1560, "PUB": 1560}, 1600, "b402a90b5b42828a"),
    "vcube-ps/off/40": ({"ACK": 1560, "PUB": 1560}, 1600, "726ccfc89f3f3780"),
    "vcube-ps/on/64": ({"ACK": 4032, "PUB": 4032}, 4096, "dab8cd88b4a0b994"),
}
"""case -> (packets by kind, deliveries, digest).  The digests were renewed once,
when the metrics' percentiles moved to the nearest-rank rule (``p2p._stats``):
with the old rule swapped back in, every run still gives the old digests.  The
churn cases were renewed when SUB ACKs and announces began to carry
``predates`` (issue 19): the same deliveries, and with those bytes taken out of
the size model (``wire_size``) the old packet counts (1-2 packets moved
between frames by the larger ACKs); churn/recover's digest once more when
announces began to carry them, and again when they began to carry
``beyond`` (each time the same counts and the same delivery events, at the
same times; with ``beyond`` taken out of ``wire_size``, the previous digest),
and again when a subscription took the SUB rounds of later subscriptions
as ``predates`` (``VCubePS._new_subscriber``), which its SUB ACKs pass on:
the same trace, 2,168 more model bytes; and when crash relays began to send
ahead the dead rounds they name (``VCubePS._dead_rounds_ahead``): 20 more
PUB and ACK packets, the same 431 deliveries, some of them earlier.  Both
churn digests were renewed when publications began to carry their ops whole
(``PubMessage.op_joins``), so that a receiver learns an op it never heard
of from the publication that names it (``VCubePS._learn_named``): in
churn/recover the same 431 deliveries (16 earlier, 49 later) with 6 fewer
PUB and ACK packets; in churn/crash node 19 delivers three publications
about 1,200 time units earlier, and two subscriptions confirmed at other
times, so one delivery of a publication made before its subscriber's
confirmation moved from node 5 to node 18 (359 in both; no trace-check
violation in either run).  churn/recover's once more when crash relays
began to leave at once instead of behind the node's own round in flight
(``VCubePS._relay_now``): 22 more PUB and 23 more ACK packets; nodes 7
and 18 no longer deliver (3, 3) and node 10 no longer (15, 4), each
published after the node subscribed but before its subscription was
confirmed (not owed); no trace-check violation.  And again when a node
began to relay the dead rounds it keeps to a subscription it learns in an
announce exchange (``VCubePS._dead_rounds_to``): 7 more PUB and ACK
packets, the same 428 deliveries (193 earlier, 154 later, as frames
moved); no trace-check violation.  And when a round of a source already
known to have crashed began to be relayed as it comes
(``VCubePS._relay_late``): 13 more PUB and ACK packets, the same 428
deliveries (191 earlier, 156 later); no trace-check violation.  And when a
frontier began to stop before a publication that names one in a gap of its
receiver's reception (``GAP_FROM``, ``VCubePS._note_novel``): the same trace,
48 bytes fewer on the links (shorter frontiers in ACKs).  Every digest was
renewed when publications began to carry the 16-byte ordinal envelope
(``p2p.machine._frontier``) in both membership modes: with those 16 bytes
per publication taken out of the size model (``wire_size`` and
``BroadcastMessage.size``), every run gives the previous digest.  The fence
(``topics._fence``) sends nothing in any of these runs."""


CASES = {
    "vcube-ps/on/64": lambda: _all_publish("vcube-ps", "on", 64, 7),
    "vcube-ps/causal/40": lambda: _all_publish("vcube-ps", "causal", 40, 8),
    "vcube-ps/off/40": lambda: _all_publish("vcube-ps", "off", 40, 9),
    "srpt/on/32": lambda: _all_publish("srpt", "on", 32, 10),
    "causal-broadcast/on/32": lambda: _all_publish("causal-broadcast", "on", 32, 11),
    "churn/crash": lambda: _churn(12, recover=False),
    "churn/recover": lambda: _churn(13, recover=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_run(case: str) -> None:
    sim, events = CASES[case]()
    rec = sim.recorder
    got = (dict(sorted(rec.packets.items())), rec.deliveries, _digest(sim, events))
    assert got == GOLDEN[case]

"""Revocation in the simulator: the machine's own rule, run on every node.

``time;REVOKE;node;other``: the fleet's list naming ``other`` reaches ``node``;
every member passes a list it adopts to its VCube neighbours, so with no
loss each member drops the revoked node within ``ceil(log2 n)`` one-way
delays of the first adoption (docs/runtime.md, "Revocation").  The revoked
node keeps running and publishing attempts are refused; the members lose
nothing of each other.
"""

from __future__ import annotations

import math
import random

import pytest

from p2p.sim import DETECTOR, DelayModel, Simulation, check_trace, check_views, format_violations

DELAYS = DelayModel()
HOP = DELAYS.tpc + DELAYS.tpp_mean + 6 * DELAYS.tpp_stdev
"""One one-way delay of a control message, bounded at six standard deviations."""


def _run(n: int, seed: int, revoked: int, at: int) -> Simulation:
    """``n`` nodes subscribe to ``t``; publications from random members before and
    after ``revoked`` is revoked at node ``at`` (time 6000)."""
    sim = Simulation(list(range(n)), seed=seed, detector=DETECTOR)
    rng = random.Random(seed)
    for node in sim.ids:
        sim.schedule(0.0, "SUB", node, "t")
    members = [x for x in sim.ids if x != revoked]
    for k in range(30):
        source = rng.choice(sim.ids if k < 10 else members)
        sim.schedule(3000.0 + 300.0 * k, "PUB", source, "t", b"m%d" % k)
    sim.schedule(6000.0, "REVOKE", at, str(revoked))
    sim.schedule(7000.0, "PUB", revoked, "t", b"from the revoked node")
    sim.run()
    return sim


@pytest.mark.parametrize(("n", "seed"), [(8, 1), (16, 2), (16, 3), (32, 4), (32, 5)])
def test_every_member_drops_a_revoked_node_within_the_bound(n: int, seed: int) -> None:
    revoked, at = 5, 0
    sim = _run(n, seed, revoked, at)
    assert sim._members is not None
    dropped = {member: t for t, member, node in sim._members.dropped if node == revoked}
    members = set(sim.ids) - {revoked}
    assert set(dropped) == members  # the first holder included
    bound = math.ceil(math.log2(n)) * HOP
    late = {m: t - 6000.0 for m, t in dropped.items() if t - 6000.0 > bound}
    assert not late, f"dropped later than {bound}: {late}"
    for m in members:  # and never taken back, whatever its detector gossips
        assert revoked not in sim.machines[m].alive
        assert revoked in sim.machines[m].revoked
    assert sim.membership_metrics()["agreed"] is True


@pytest.mark.parametrize("seed", [6, 7, 8])
def test_members_lose_nothing_of_each_other_and_refuse_the_revoked(seed: int) -> None:
    sim = _run(16, seed, revoked=3, at=9)
    found = check_trace(sim.recorder.trace, quiescent=sim.quiescent()) + check_views(sim)
    assert not found, format_violations(found)
    assert sim.quiescent()
    late = [e for e in sim.recorder.trace if e.event == "deliver" and e.time > 7000.0]
    assert late, "publications after the revocation were delivered"
    assert {e.node for e in late} <= set(range(16)) - {3}
    refused = [r for r in sim.recorder.refusals if r[2] == "PUB"]
    assert [r[4] for r in refused] == ["node is revoked"]
    # Every member delivered every publication made after the revocation.
    after = {
        (e.source, e.seq) for e in sim.recorder.trace if e.event == "publish" and e.time > 6000.0
    }
    for member in set(range(16)) - {3}:
        got = {
            (e.source, e.seq)
            for e in sim.recorder.trace
            if e.event == "deliver" and e.node == member
        }
        assert after <= got, member


def test_revoke_needs_the_detector_and_a_known_node() -> None:
    sim = Simulation(list(range(4)), seed=1)
    with pytest.raises(Exception, match="needs the failure detector"):
        sim.schedule(1.0, "REVOKE", 0, "2")
    sim = Simulation(list(range(4)), seed=1, detector=DETECTOR)
    with pytest.raises(Exception, match="unknown node"):
        sim.schedule(1.0, "REVOKE", 0, "9")

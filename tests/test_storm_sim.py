"""A boot storm in the simulator: many nodes start at once, one seed.

Node 1 and node 2 seed each other and every other node seeds node 1 (the
seed-only discovery of ``p2p node --seed``); the subscribers subscribe two
seconds in, most of them knowing only themselves and their seed; the
publisher subscribes a minute later, when it knows everyone, and publishes.
Every packet goes through the runtime's codec on its way (``wire=True``),
so a packet the runtime could not send fails the run.  Every subscriber
delivers every publication, the views converge, and the trace checks hold.

Before, the publisher's first publication named all 127 subscriptions, its
``op_joins`` did not fit a 64-bit integer, and the codec wrote a tag every
receiver refused: 128 real nodes delivered 0 of 25,400.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from p2p.sim import DETECTOR, Simulation, assert_no_violations, check_trace, check_views
from p2p.wire import WireError

COUNT = 20


def _storm(n: int, seed: int) -> Simulation:
    rng = random.Random(seed)
    ids = [rng.getrandbits(64) for _ in range(n)]
    seeds = {ids[1]: [ids[2]], ids[2]: [ids[1]]}
    seeds.update((i, [ids[1]]) for i in [ids[0], *ids[3:]])
    sim = Simulation(ids, seed=seed, detector=DETECTOR, introductions=seeds, wire=True)
    for node in ids[1:]:
        sim.schedule(2000.0 + rng.uniform(0.0, 500.0), "SUB", node, "chat")
    sim.schedule(60_000.0, "SUB", ids[0], "chat")
    for j in range(COUNT):
        sim.schedule(62_000.0 + 50.0 * j, "PUB", ids[0], "chat", b"m%d" % j)
    return sim


@pytest.mark.parametrize(("n", "seed"), [(72, 1), (128, 2)])
def test_a_boot_storm_delivers_everything(n: int, seed: int) -> None:
    sim = _storm(n, seed)
    sim.run()
    found = check_trace(sim.recorder.trace, quiescent=True) + check_views(sim)
    assert_no_violations(found, f"seed {seed}")
    got = Counter(e.node for e in sim.recorder.trace if e.event == "deliver")
    assert sorted(got.values()) == [COUNT] * n, got
    assert sim.membership_metrics()["converged"] is True


def test_the_codec_refused_what_the_storm_sends(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the encoder of before (``op_joins`` as a plain integer, a bignum
    tag from 2**64 on), the same storm fails on the publisher's first round."""
    from p2p.wire import _cbor, _encode

    monkeypatch.setattr(_encode, "_e_joins", _cbor._e_int)
    with pytest.raises(WireError, match="tag"):
        _storm(72, 1).run()

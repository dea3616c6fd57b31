"""Runs (``topics._runs``): delivering a chain of one round in one step gives
exactly what delivering it publication by publication gives.

Each example runs one random simulated script twice, with runs and with the
per-publication path only (``_chain_end`` finds no chain), and compares a
hash of everything the recorder saw (the trace, the metrics, the link log,
the holds) with the engine's loss counters.  Scripts publish in bursts, so
rounds carry chains; the test also requires that runs were taken at all.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim_golden import _digest

import topics._runs as runs
from p2p.sim import DETECTOR, Simulation, legal_script

NODES = 10


def _script(seed: int, *, crashes: bool) -> list[tuple[float, str, int, str]]:
    """Random steps in bursts: a node's publications a few time units apart,
    so that several go out in one round."""
    rng = random.Random(seed)
    steps: list[tuple[float, int, str, int]] = []
    for _ in range(NODES * 4):
        node, topic, at = rng.randrange(NODES), rng.choice("ab"), rng.uniform(0.0, 6000.0)
        for k in range(rng.choice((1, 1, 4, 12))):
            steps.append((at + k * rng.uniform(0.0, 3.0), node, topic, 1 + rng.randrange(9)))
        steps.append((at + 1.0, node, topic, rng.randrange(10)))
    return legal_script(steps, crash_roll=9 if crashes else None, max_down=3, recover=True)


def _run(seed: int, *, detector: bool, crashes: bool) -> tuple[str, int]:
    sim = (
        Simulation(list(range(NODES)), seed=seed, detector=DETECTOR, record_links=True)
        if detector
        else Simulation(list(range(NODES)), seed=seed, record_links=True)
    )
    for time, action, node, topic in _script(seed, crashes=crashes):
        sim.schedule(time, action, node, topic, b"p" if action == "PUB" else b"")
    events = sim.run()
    return _digest(sim, events), sim.recorder.deliveries


class _Counted:
    """Counts the runs taken (``_deliver_run`` calls) around the real one."""

    def __init__(self) -> None:
        self.runs = 0
        self.real = runs._Runs._deliver_run

    def __call__(self, state: object, chain: tuple[object, ...]) -> object:
        self.runs += 1
        return self.real(state, chain)  # type: ignore[arg-type]


@pytest.mark.parametrize(("detector", "crashes"), [(False, False), (False, True), (True, True)])
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_runs_change_nothing_but_the_work(detector: bool, crashes: bool, seed: int) -> None:
    counted = _Counted()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runs._Runs, "_deliver_run", staticmethod(counted))
        fast = _run(seed, detector=detector, crashes=crashes)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runs, "_chain_end", lambda fresh, start: start)
        slow = _run(seed, detector=detector, crashes=crashes)
    assert fast == slow
    assert counted.runs > 0, "no round carried a chain: the script tests nothing"

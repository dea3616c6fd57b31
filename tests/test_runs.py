"""Runs (``topics._runs``): delivering a chain of one round in one step gives
exactly what delivering it publication by publication gives.

Each example runs one random simulated script twice, with runs and with the
per-publication path only (``_chain_end`` finds no chain), and compares a
hash of everything the recorder saw (the trace, the metrics, the link log,
the holds) with the engine's loss counters.  Scripts publish in bursts, so
rounds carry chains; the test also requires that runs were taken at all.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim_golden import _digest

import topics._rounds as rounds
import topics._runs as runs
from causal import MsgId
from p2p.sim import DETECTOR, Simulation, legal_script
from topics import Chain, PubMessage, chain_of

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


class _Chains:
    """Counts the rounds ``chain_of`` marked as chains around the real one."""

    def __init__(self) -> None:
        self.chains = 0

    def __call__(self, messages: Sequence[PubMessage]) -> tuple[PubMessage, ...]:
        out = chain_of(messages)
        self.chains += type(out) is Chain
        return out


@pytest.mark.parametrize(("detector", "crashes"), [(False, False), (False, True), (True, True)])
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_chains_change_nothing_but_the_work(detector: bool, crashes: bool, seed: int) -> None:
    """A round marked as a ``Chain`` is taken by its receivers with one check of
    its structure instead of one per publication (``_fresh``, ``_check_remote``,
    ``_note_novel``, ``_chain_end``): the same runs, unmarked, give the same."""
    counted = _Chains()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rounds, "chain_of", counted)
        marked = _run(seed, detector=detector, crashes=crashes)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rounds, "chain_of", tuple)
        unmarked = _run(seed, detector=detector, crashes=crashes)
    assert marked == unmarked
    assert counted.chains > 0, "no round was a chain: the script tests nothing"


@settings(max_examples=300, deadline=None)
@given(
    seqs=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    links=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_chain_of_marks_exactly_the_chains(seqs: list[int], links: list[bool]) -> None:
    """``chain_of`` marks a round as a ``Chain`` exactly when it has two or more
    publications, each after the first names only the one before it
    (``chains_on``) and comes after it."""
    msgs: list[PubMessage] = []
    for i, seq in enumerate(seqs):
        mid = MsgId(7, 1, seq)
        if i and links[i]:  # a follower of the one before
            before = msgs[-1].id
            msgs.append(PubMessage(mid, b"p", (before,), (), before.seq))
        else:
            msgs.append(PubMessage(mid, b"p", (MsgId(8, 0, seq),), (), seq - 1))
    want = len(msgs) >= 2 and all(
        m.chains_on(b.id) and m.id.seq > b.id.seq for b, m in itertools.pairwise(msgs)
    )
    out = chain_of(msgs)
    assert out == tuple(msgs)
    assert (type(out) is Chain) == want
    assert type(out[1:]) is tuple  # a slice is no chain

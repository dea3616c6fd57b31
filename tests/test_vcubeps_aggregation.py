"""Causal aggregation inside VCube-PS, checked on the simulator's own records.

The churn cases (subscribe / unsubscribe while publishing, with aggregation on,
the default) are covered by the state machine in ``test_properties.py``; these
tests pin what only a static topic makes exact: aggregation changes neither
what is delivered nor its order, and every hold-back is justified.
"""

from __future__ import annotations

import random
from collections import defaultdict

from hypothesis import given
from hypothesis import strategies as st
from strategies import populations

from causal import MsgId
from p2p.sim import Simulation, check_trace


@st.composite
def hot_topics(draw: st.DrawFn) -> tuple[list[int], list[tuple[float, int]], int, bool]:
    """Sparse or dense ids, 1-3 publications per node, seed, triangle-violating links."""
    ids = draw(populations(2, 24))
    n = len(ids)
    pubs = draw(
        st.lists(
            st.tuples(st.floats(0, 600, allow_nan=False), st.integers(0, n - 1)),
            min_size=1,
            max_size=3 * n,
        )
    )
    return ids, pubs, draw(st.integers(0, 2**32)), draw(st.booleans())


def _run(
    ids: list[int], pubs: list[tuple[float, int]], seed: int, tiv: bool, mode: str
) -> Simulation:
    delays: dict[tuple[int, int], float] = {}

    def link(src: int, dst: int, rng: random.Random) -> float:
        # Fixed random per-link delays 1..500: relayed paths often beat direct ones.
        if (src, dst) not in delays:
            delays[(src, dst)] = rng.uniform(1, 500)
        return delays[(src, dst)] + rng.uniform(0, 5)

    sim = Simulation(
        ids, seed=seed, aggregation=mode, record_links=True, link_delay=link if tiv else None
    )
    sim.preset_subscriptions("hot", ids)
    for t, node in pubs:
        sim.schedule(t, "PUB", ids[node], "hot", b"p" * (node % 7))
    sim.run()
    assert sim.quiescent()
    return sim


def _deliveries(sim: Simulation) -> set[tuple[int, int | None, int | None]]:
    return {(e.node, e.source, e.seq) for e in sim.recorder.trace if e.event == "deliver"}


def _causal_past(sim: Simulation) -> dict[MsgId, set[MsgId]]:
    """``m -> past(m)`` from the trace: what m's source had delivered or published first."""
    seen: dict[int, set[MsgId]] = defaultdict(set)
    past: dict[MsgId, set[MsgId]] = {}
    for e in sorted(sim.recorder.trace, key=lambda e: e.time):
        if e.event not in ("publish", "deliver") or e.source is None or e.seq is None:
            continue
        mid = MsgId(sim.ids[e.source], 0, e.seq)
        if e.event == "publish":
            past[mid] = set(seen[e.node])
        seen[e.node].add(mid)
        seen[e.node] |= past.get(mid, set())
    return past


@given(hot_topics())
def test_aggregation_changes_neither_deliveries_nor_order(
    case: tuple[list[int], list[tuple[float, int]], int, bool],
) -> None:
    ids, pubs, seed, tiv = case
    runs = {mode: _run(ids, pubs, seed, tiv, mode) for mode in ("off", "causal", "on")}
    expected = _deliveries(runs["off"])
    assert len(expected) == len(ids) * len(pubs)  # everyone delivers everything once
    for mode, sim in runs.items():
        assert _deliveries(sim) == expected, mode
        assert not check_trace(sim.recorder.trace), mode
    assert not runs["off"].recorder.holds


@given(hot_topics())
def test_every_hold_is_justified_and_released_with_its_blocker(
    case: tuple[list[int], list[tuple[float, int]], int, bool],
) -> None:
    """A held packet leaves in the same link packet as a causal predecessor that
    reached the holding node only after the hold; no hold is ever mistaken."""
    ids, pubs, seed, tiv = case
    for mode in ("causal", "on"):
        sim = _run(ids, pubs, seed, tiv, mode)
        assert sum(getattr(c, "mistaken_holds", 0) for c in sim.nodes.values()) == 0
        past = _causal_past(sim)
        # (node, message) -> (time the node processed it, position in its link packet)
        arrivals: dict[tuple[int, MsgId], tuple[float, int]] = {}
        carried: dict[tuple[int, int, MsgId], tuple[MsgId, ...]] = {}
        for t, src, dst, _size, mids in sim.recorder.links:
            for pos, mid in enumerate(mids):
                arrivals.setdefault((dst, mid), (t, pos))
                assert (src, dst, mid) not in carried  # never twice over one link
                carried[(src, dst, mid)] = mids
        for t_hold, node, child, held_ids in sim.recorder.holds:
            first = held_ids[0]
            together = carried[(node, child, first)]
            held_at = arrivals[(node, first)]
            assert held_at[0] == t_hold
            # The blocker reached the node after the held publication was handled.
            blockers = [
                d
                for d in together
                if d in past[first] and arrivals.get((node, d), (float("inf"), 0)) > held_at
            ]
            assert blockers, (mode, node, child, first, together)


def test_a_hot_topic_does_aggregate() -> None:
    """Existence: with crossing trees and link delays, some packets are held back
    and released together (not vacuous)."""
    rng = random.Random(7)
    ids = list(range(32))
    pubs = [(rng.uniform(0, 300), i) for i in ids for _ in range(2)]
    sim = _run(ids, pubs, seed=3, tiv=True, mode="causal")
    off = _run(ids, pubs, seed=3, tiv=True, mode="off")
    assert sim.recorder.holds
    assert sim.recorder.frames < off.recorder.frames
    assert max(len(m) for *_, m in sim.recorder.links) > 1


def test_pending_max_counts_held_publications() -> None:
    """The per-node ``pending_max`` counter reports VCube-PS hold-backs too."""
    rng = random.Random(7)
    ids = list(range(32))
    pubs = [(rng.uniform(0, 300), i) for i in ids for _ in range(2)]
    sim = _run(ids, pubs, seed=3, tiv=True, mode="off")
    counters = sim.recorder.metrics()["nodes"]
    assert max(c["pending_max"] for c in counters.values()) > 0
    assert all(c.pending_max == sim.recorder.pending_max[n] for n, c in sim.nodes.items())

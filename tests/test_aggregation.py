"""Properties of the timer-free causal aggregation of causal broadcast (thesis ch. 4).

Algorithm 2 (``causal/_broadcast.py``) lets node ``i`` hold a message ``m``
back from its child ``k`` while ``k`` could not deliver it anyway: some causal
predecessor ``m''`` of ``m`` has not reached ``i`` yet and ``i`` is the node
that forwards ``m''`` to ``k``.  These tests run random broadcast scripts on
the simulator with aggregation ``off``, ``causal`` (Algorithm 2 alone) and
``on`` (plus link coalescing) and check, from the recorded trace and link
packets only (causality is recomputed from the trace, never read from the
cores):

1. all three modes deliver the same (node, message) pairs, each exactly once,
   in causal and per-source FIFO order;
2. each message crosses exactly the ``N-1`` links of its source's spanning
   tree, each once;
3. a message is held from a child exactly while such a predecessor ``m''`` is
   missing at the holder, and a held message later reaches that child once;
4. link packets never exceed the MTU unless they carry one oversized message;
5. ``off`` never holds and sends one message per packet; ``causal`` does hold
   under triangle-inequality-violating delays.

Plus the worked example of thesis §4.4.3, driven on the sans-IO cores.
Failures replay from the printed blob; the example count comes from the active
Hypothesis profile (``conftest.py``).
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from hypothesis import given, note, target
from hypothesis import strategies as st
from strategies import populations

from causal import (
    BroadcastConfig,
    BroadcastOutput,
    CausalBroadcast,
    HeldBack,
    MessageSet,
    MsgId,
    PacketLimits,
    Transmit,
)
from p2p.sim import DelayModel, Simulation, TraceEvent, assert_no_violations, check_trace
from vcube import Hypercube

MODES = ("off", "causal", "on")
TOPIC = "t"
HEADER = 20


# ---------------------------------------------------------------------------
# Scenarios.
# ---------------------------------------------------------------------------


@dataclass
class PerLinkDelay:
    """A fixed random base delay in ``[1, 500]`` per directed link, plus jitter.

    Bases are independent per link, so a relayed path often beats the direct
    one (the triangle inequality fails).  A run stays a pure function of
    ``salt`` and the simulator's seed.
    """

    salt: int
    jitter: float
    _base: dict[tuple[int, int], float] = field(default_factory=dict, repr=False)

    def __call__(self, src: int, dst: int, rng: random.Random) -> float:
        base = self._base.get((src, dst))
        if base is None:
            base = self._base[(src, dst)] = random.Random(f"{self.salt}/{src}/{dst}").uniform(
                1.0, 500.0
            )
        return base + (rng.uniform(0.0, self.jitter) if self.jitter else 0.0)


@dataclass(frozen=True)
class Scenario:
    """Who broadcasts when, with which payload size, under which delays."""

    ids: list[int]
    pubs: list[tuple[float, int, int]]  # (time, node id, payload size)
    seed: int
    delays: DelayModel | None
    link_salt: int | None
    jitter: float

    def run(self, mode: str, mtu: int = 1500) -> Simulation:
        link = None if self.link_salt is None else PerLinkDelay(self.link_salt, self.jitter)
        sim = Simulation(
            self.ids,
            protocol="causal-broadcast",
            aggregation=mode,
            seed=self.seed,
            delays=self.delays,
            link_delay=link,
            record_links=True,
            limits=PacketLimits(mtu=mtu, header=HEADER),
        )
        sim.preset_subscriptions(TOPIC, self.ids)
        for k, (time, node, size) in enumerate(self.pubs):
            sim.schedule(time, "PUB", node, TOPIC, (b"%d:" % k + b"x" * size)[:size])
        sim.run()
        assert sim.quiescent(), f"{mode}: did not quiesce"
        assert sim.recorder.refusals == [], sim.recorder.refusals
        return sim


DELAY_MODELS = st.sampled_from(
    [
        DelayModel(),
        DelayModel(tpp_mean=100.0, tpp_stdev=100.0),
        DelayModel(tpp_mean=20.0, tpp_stdev=0.0),
        DelayModel(tpc=0.0, tt=0.0, tpp_mean=50.0, tpp_stdev=50.0),
    ]
)


@st.composite
def scenarios(draw: st.DrawFn, max_nodes: int = 40, max_payload: int = 200) -> Scenario:
    ids = draw(populations(2, max_nodes), label="ids")
    n = len(ids)
    counts = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n), label="counts")
    if not any(counts):
        counts[0] = 1
    total = sum(counts)
    times = draw(st.lists(st.integers(0, 1500), min_size=total, max_size=total), label="times")
    sizes = draw(
        st.lists(st.integers(0, max_payload), min_size=total, max_size=total), label="sizes"
    )
    owners = [ids[i] for i, c in enumerate(counts) for _ in range(c)]
    pubs = [(float(t), node, s) for t, node, s in zip(times, owners, sizes, strict=True)]
    seed = draw(st.integers(0, 2**32 - 1), label="seed")
    if draw(st.booleans(), label="per-link delays"):
        salt = draw(st.integers(0, 2**16), label="link salt")
        jitter = draw(st.sampled_from([0.0, 1.0, 30.0]), label="jitter")
        scn = Scenario(ids, pubs, seed, None, salt, jitter)
    else:
        scn = Scenario(ids, pubs, seed, draw(DELAY_MODELS, label="delay model"), None, 0.0)
    note(repr(scn))
    return scn


# ---------------------------------------------------------------------------
# Independent views of a run, from its trace and link packets only.
# ---------------------------------------------------------------------------


def _mid(ids: list[int], ev: TraceEvent) -> MsgId:
    assert ev.source is not None
    assert ev.seq is not None
    return MsgId(ids[ev.source], 0, ev.seq)


def published(sim: Simulation) -> list[MsgId]:
    return [_mid(sim.ids, ev) for ev in sim.recorder.trace if ev.event == "publish"]


def causal_past(sim: Simulation) -> dict[MsgId, frozenset[MsgId]]:
    """``m'' -> m`` iff ``m''`` is in ``causal_past(sim)[m]``.

    The source of ``m`` published or delivered ``m''`` before publishing
    ``m``, closed transitively (the trace is in processing order).
    """
    seen: dict[int, set[MsgId]] = defaultdict(set)
    past: dict[MsgId, frozenset[MsgId]] = {}
    for ev in sim.recorder.trace:
        if ev.event not in ("publish", "deliver"):
            continue
        m = _mid(sim.ids, ev)
        if ev.event == "publish":
            direct = seen[ev.node]
            closure = set(direct)
            for x in direct:
                closure |= past[x]
            past[m] = frozenset(closure)
        seen[ev.node].add(m)
    return past


def delivery_order(sim: Simulation) -> dict[int, list[MsgId]]:
    """Per node id, the messages it delivered, in order."""
    out: dict[int, list[MsgId]] = {n: [] for n in sim.ids}
    for ev in sim.recorder.trace:
        if ev.event == "deliver":
            out[sim.ids[ev.node]].append(_mid(sim.ids, ev))
    return out


def reception_order(sim: Simulation) -> dict[int, list[MsgId]]:
    """Per node id, the messages it received, in the order it processed them."""
    out: dict[int, list[MsgId]] = {n: [] for n in sim.ids}
    for _, _, dst, _, mids in sim.recorder.links:
        out[dst].extend(mids)
    return out


def crossings(sim: Simulation) -> Counter[tuple[MsgId, int, int]]:
    """How often each message crossed each directed link."""
    return Counter((m, src, dst) for _, src, dst, _, mids in sim.recorder.links for m in mids)


def tree_links(overlay: Hypercube, ids: list[int], source: int) -> set[tuple[int, int]]:
    links: set[tuple[int, int]] = set()
    for n in ids:
        if n != source:
            parent = overlay.parent(n, source)
            assert parent is not None
            links.add((parent, n))
    return links


# ---------------------------------------------------------------------------
# Property checks (plain functions, so a broken variant can be fed to them).
# ---------------------------------------------------------------------------


def check_delivery(sim: Simulation, past: dict[MsgId, frozenset[MsgId]]) -> None:
    """Every node delivers every broadcast once, FIFO per source and in causal order."""
    assert_no_violations(check_trace(sim.recorder.trace, quiescent=True), sim.aggregation)
    msgs = published(sim)
    for node, order in delivery_order(sim).items():
        assert sorted(order) == sorted(msgs), (node, order, msgs)
        done: set[MsgId] = set()
        last: dict[int, int] = {}
        for m in order:
            assert m.seq == last.get(m.source, 0) + 1, f"{node} delivered {m} out of FIFO"
            last[m.source] = m.seq
            missing = past[m] - done
            assert not missing, f"{node} delivered {m} before its predecessors {missing}"
            done.add(m)


def check_tree_crossings(sim: Simulation) -> None:
    """Each message crosses each link of its source's tree once, and no other link."""
    crossed = crossings(sim)
    twice = {key: c for key, c in crossed.items() if c != 1}
    assert not twice, f"messages crossing a link more than once: {twice}"
    by_msg: dict[MsgId, set[tuple[int, int]]] = defaultdict(set)
    for m, src, dst in crossed:
        by_msg[m].add((src, dst))
    msgs = published(sim)
    assert set(by_msg) <= set(msgs), set(by_msg) - set(msgs)
    for m in msgs:
        expected = tree_links(sim.overlay, sim.ids, m.source)
        assert len(expected) == len(sim.ids) - 1
        assert by_msg.get(m, set()) == expected, (m, by_msg.get(m), expected)


def check_holds(sim: Simulation, past: dict[MsgId, frozenset[MsgId]]) -> int:
    """Holds happen exactly when the aggregation condition holds; returns how many.

    When node ``i`` processes ``m`` and ``k`` is its child in ``m``'s tree, the
    condition is: some ``m'' -> m`` has not yet been received (nor published) by
    ``i``, and ``i`` is ``k``'s parent in ``m''.source``'s tree.  "Not yet" is
    judged in ``i``'s processing order (a packet's messages one after the other).
    """
    rec = sim.recorder
    ov = sim.overlay
    holds: Counter[tuple[int, int, MsgId]] = Counter()
    hold_time: dict[tuple[int, int, MsgId], float] = {}
    for time, node, child, mids in rec.holds:
        for m in mids:
            holds[(node, child, m)] += 1
            hold_time[(node, child, m)] = time
    again = {key: c for key, c in holds.items() if c > 1}
    assert not again, f"held more than once: {again}"
    arrival = {(dst, m): t for t, _, dst, _, mids in rec.links for m in mids}
    aggregating = sim.aggregation != "off"
    expected: set[tuple[int, int, MsgId]] = set()
    for node, order in reception_order(sim).items():
        have: set[MsgId] = set()
        for m in order:
            for k in ov.children(node, m.source):
                blockers = [
                    x
                    for x in past[m]
                    if x.source != node and x not in have and ov.parent(k, x.source) == node
                ]
                if blockers and aggregating:
                    expected.add((node, k, m))
                    assert (node, k, m) in holds, (
                        f"{node} sent {m} to {k} although it lacked {blockers}"
                    )
                else:
                    assert (node, k, m) not in holds, (
                        f"{node} held {m} from {k} with nothing to wait for"
                        f" (received before: {sorted(have)})"
                    )
            have.add(m)
    assert set(holds) == expected, set(holds) ^ expected
    crossed = crossings(sim)
    for node, k, m in holds:
        assert hold_time[(node, k, m)] >= arrival[(node, m)]
        assert crossed[(m, node, k)] == 1, f"held {m} reached {k} {crossed[(m, node, k)]} times"
        assert arrival[(k, m)] >= hold_time[(node, k, m)]
    return len(holds)


def check_mtu(sim: Simulation, mtu: int) -> int:
    """No link packet above the MTU unless it is one oversized message; returns bundles."""
    bundles = 0
    for _, src, dst, size, mids in sim.recorder.links:
        assert mids, f"empty link packet {src} -> {dst}"
        assert size <= mtu or len(mids) == 1, f"{src} -> {dst}: {size} B > {mtu} with {mids}"
        bundles += len(mids) > 1
    return bundles


# ---------------------------------------------------------------------------
# The properties.
# ---------------------------------------------------------------------------


@given(scn=scenarios())
def test_modes_deliver_the_same_in_causal_order(scn: Scenario) -> None:
    """Property 1: off, causal and on deliver the same pairs, once each, in causal order."""
    delivered: dict[str, set[tuple[int, MsgId]]] = {}
    for mode in MODES:
        sim = scn.run(mode)
        check_delivery(sim, causal_past(sim))
        pairs = [(n, m) for n, order in delivery_order(sim).items() for m in order]
        assert len(pairs) == len(set(pairs))
        delivered[mode] = set(pairs)
    assert delivered["off"] == delivered["causal"] == delivered["on"]
    assert len(delivered["off"]) == len(scn.ids) * len(scn.pubs)


@given(scn=scenarios(), mode=st.sampled_from(MODES))
def test_each_message_crosses_its_tree_once(scn: Scenario, mode: str) -> None:
    """Property 2: every message crosses exactly the N-1 links of its source's tree."""
    sim = scn.run(mode)
    check_tree_crossings(sim)
    assert len(crossings(sim)) == len(scn.pubs) * (len(scn.ids) - 1)


@given(scn=scenarios(), mode=st.sampled_from(["causal", "on"]))
def test_held_exactly_while_a_forwarded_predecessor_is_missing(scn: Scenario, mode: str) -> None:
    """Property 3: the aggregation condition, recomputed from the trace, explains every hold."""
    sim = scn.run(mode)
    held = check_holds(sim, causal_past(sim))
    target(float(held), label="hold-backs")


@given(
    scn=scenarios(max_nodes=24),
    mode=st.sampled_from(MODES),
    mtu=st.integers(120, 400),
)
def test_link_packets_fit_the_mtu(scn: Scenario, mode: str, mtu: int) -> None:
    """Property 4: small MTUs split bundles; only a lone oversized message exceeds it."""
    sim = scn.run(mode, mtu=mtu)
    bundles = check_mtu(sim, mtu)
    target(float(bundles), label="multi-message packets")
    check_tree_crossings(sim)


@given(scn=scenarios(max_nodes=24))
def test_off_never_holds_nor_bundles(scn: Scenario) -> None:
    """Property 5a: without aggregation nothing waits and each packet is one message."""
    sim = scn.run("off")
    assert sim.recorder.holds == []
    assert all(len(mids) == 1 for *_, mids in sim.recorder.links)
    check_holds(sim, causal_past(sim))


def _busy_scenario() -> Scenario:
    ids = list(range(16))
    rng = random.Random(7)
    pubs = [(float(rng.randrange(0, 600)), n, rng.randrange(0, 64)) for n in ids for _ in (1, 2)]
    return Scenario(ids, pubs, seed=1, delays=None, link_salt=3, jitter=1.0)


def test_causal_aggregation_holds_back_under_skewed_delays() -> None:
    """Property 5b: hold-backs do happen (fixed scenario, not flaky), all justified."""
    scn = _busy_scenario()
    for mode in ("causal", "on"):
        sim = scn.run(mode)
        assert check_holds(sim, causal_past(sim)) > 0, mode
        check_delivery(sim, causal_past(sim))
        check_tree_crossings(sim)
    off = scn.run("off")
    assert off.recorder.holds == []


# ---------------------------------------------------------------------------
# Thesis §4.4.3, worked example, on the sans-IO cores.
# ---------------------------------------------------------------------------


def _sends(out: list[BroadcastOutput]) -> list[tuple[int, list[MsgId]]]:
    return [(o.dest, [m.id for m in o.packet.messages]) for o in out if isinstance(o, Transmit)]


def test_thesis_worked_example() -> None:
    """m2,1 -> m2,2 -> m2,3 -> m0,1; node 4 gets all but m2,2 first (thesis §4.4.3).

    Node 4 sends m2,1 alone to 5, holds m2,3 and m0,1 from 5 (but sends m0,1
    to 6 at once), and on m2,2 sends m2,2, m2,3 and m0,1 to 5 in one packet.
    """
    overlay = Hypercube(range(8))
    assert overlay.children(4, 2) == (5,)
    assert overlay.children(4, 0) == (5, 6)
    cores = {n: CausalBroadcast(n, overlay=overlay, config=BroadcastConfig()) for n in range(8)}
    to_four: dict[MsgId, tuple[int, MessageSet]] = {}

    def flood(node: int, out: list[BroadcastOutput]) -> None:
        """Deliver every packet at once, except those to node 4 (kept for later)."""
        work = [(node, o) for o in out]
        while work:
            sender, o = work.pop(0)
            if not isinstance(o, Transmit):
                continue
            if o.dest == 4:
                assert len(o.packet.messages) == 1
                to_four[o.packet.messages[0].id] = (sender, o.packet)
                continue
            work.extend((o.dest, x) for x in cores[o.dest].receive(sender, o.packet, 0.0))

    for _ in range(3):
        flood(2, cores[2].broadcast(b"", 0.0))
    assert cores[0].vc == {2: 3}
    flood(0, cores[0].broadcast(b"", 0.0))
    m21, m22, m23 = (MsgId(2, 0, s) for s in (1, 2, 3))
    m01 = MsgId(0, 0, 1)
    assert set(to_four) == {m21, m22, m23, m01}

    def at_four(m: MsgId) -> list[BroadcastOutput]:
        sender, packet = to_four[m]
        return cores[4].receive(sender, packet, 0.0)

    out = at_four(m21)
    assert _sends(out) == [(5, [m21])]
    out = at_four(m23)
    assert _sends(out) == []
    assert [o for o in out if isinstance(o, HeldBack)] == [HeldBack(5, m23)]
    out = at_four(m01)
    assert _sends(out) == [(6, [m01])]
    assert [o for o in out if isinstance(o, HeldBack)] == [HeldBack(5, m01)]
    out = at_four(m22)
    sends = _sends(out)
    assert len(sends) == 1, sends
    dest, bundle = sends[0]
    assert dest == 5
    assert sorted(bundle) == sorted([m22, m23, m01])
    assert cores[4].idle()

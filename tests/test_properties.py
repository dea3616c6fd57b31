"""Protocol properties of VCube-PS on the simulator (DESIGN.md §8).

* :class:`PubSubMachine`, a Hypothesis ``RuleBasedStateMachine``: random
  populations (sparse 64-bit or dense ids), 1..3 topics, per-link base delays
  drawn by Hypothesis (fast and very slow links side by side, so relayed paths
  overtake direct ones and the triangle inequality fails) plus seeded jitter;
  rules subscribe / unsubscribe / publish / deliver-one / advance-time /
  crash / recover (a crash may land inside the node's processing window, and
  the checker's ``inert`` kind then proves it did nothing after it).  Every
  step checks the safety invariants (no duplicates, no invention, no delivery
  while unsubscribed, per-source FIFO, causal order per topic) on the trace so
  far; teardown runs to quiescence and checks liveness/agreement and that every
  confirmed subscriber's view is the true subscriber set.
* :func:`test_random_scripts`: bigger populations (8..40 nodes) running a
  random timed SUB/UNS/PUB script to quiescence, all checks.
* :func:`test_simulation_is_deterministic`: same seed, same trace.

Failures replay from the printed blob (``print_blob`` in ``conftest.py``); the
number of examples comes from the active profile (``HYPOTHESIS_PROFILE``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import event, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from strategies import populations, raw_steps

from p2p.sim import (
    Script,
    Simulation,
    TraceChecker,
    TraceEvent,
    assert_no_violations,
    check_trace,
    check_views,
    legal_script,
)

DELAYS = st.sampled_from([1.0, 5.0, 40.0, 100.0, 500.0])


@dataclass
class LinkTable:
    """Per-link base propagation delays (by node index) plus uniform jitter.

    Used as the simulator's ``link_delay``; the jitter comes from the rng the
    simulator passes, so a run stays a pure function of its seed.
    """

    default: float
    special: dict[tuple[int, int], float]
    jitter: float
    index: dict[int, int] = field(default_factory=dict, repr=False)

    def __call__(self, src: int, dst: int, rng: random.Random) -> float:
        base = self.special.get((self.index[src], self.index[dst]), self.default)
        return base + (rng.uniform(0.0, self.jitter) if self.jitter else 0.0)


@st.composite
def link_delays(draw: st.DrawFn, n: int) -> LinkTable:
    """Fast and slow links side by side: relayed paths beat direct ones."""
    default = draw(DELAYS)
    pairs = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda p: p[0] != p[1])
    special = draw(st.dictionaries(pairs, DELAYS, max_size=3 * n))
    jitter = draw(st.sampled_from([0.0, 1.0, 30.0]))
    return LinkTable(default, special, jitter)


def new_simulation(ids: list[int], seed: int, delay: LinkTable | None) -> Simulation:
    sim = Simulation(ids, seed=seed, link_delay=delay)
    if delay is not None:
        delay.index.update(sim.index)
    return sim


def topic_name(k: int) -> str:
    return f"topic-{k}"


def assert_all_checks(sim: Simulation) -> None:
    """Run to quiescence, then every trace check, liveness included, and the views."""
    sim.run()
    assert sim.quiescent(), "simulation did not quiesce"
    assert sim.recorder.refusals == [], sim.recorder.refusals
    found = check_trace(sim.recorder.trace, quiescent=True) + check_views(sim)
    assert_no_violations(found, f"seed {sim.seed}")


# ---------------------------------------------------------------------------
# The state machine.
# ---------------------------------------------------------------------------


class PubSubMachine(RuleBasedStateMachine):
    """Random SUB/UNS/PUB with the network stepped one event at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.sim: Simulation | None = None
        self.checker = TraceChecker()
        self.fed = 0
        self.topics: list[str] = []
        # Intended subscription state, in the order the actions will be processed.
        self.subscribed: dict[str, set[int]] = {}
        self.last_at: dict[int, float] = {}
        self.payloads = 0
        self.down: set[int] = set()
        """Nodes whose CRASH is scheduled and RECOVER is not (intended state)."""

    @property
    def s(self) -> Simulation:
        assert self.sim is not None
        return self.sim

    @initialize(
        ids=populations(2, 12),
        ntopics=st.integers(1, 3),
        seed=st.integers(0, 2**32 - 1),
        data=st.data(),
    )
    def setup(self, ids: list[int], ntopics: int, seed: int, data: st.DataObject) -> None:
        delay = data.draw(link_delays(len(ids)), label="delays")
        note(f"ids={ids} seed={seed} {delay}")
        self.sim = new_simulation(ids, seed, delay)
        self.topics = [topic_name(k) for k in range(ntopics)]
        self.subscribed = {t: set() for t in self.topics}
        self.last_at = dict.fromkeys(ids, 0.0)
        # Some nodes start subscribing at once (concurrent SUB rounds).
        first = data.draw(
            st.lists(st.tuples(st.sampled_from(ids), st.sampled_from(self.topics)), min_size=1),
            label="initial subscriptions",
        )
        for node, topic in first:
            if node not in self.subscribed[topic]:
                self.subscribed[topic].add(node)
                self._schedule("SUB", node, topic, 0.0)
        # ... and some of them publish while the subscriptions are spreading.
        pubs = data.draw(
            st.lists(st.tuples(st.sampled_from(first), st.sampled_from([0.0, 5.0, 200.0]))),
            label="initial publications",
        )
        for (node, topic), offset in pubs:
            self._schedule("PUB", node, topic, offset)

    # --------------------------------------------------------- local calls

    def _schedule(self, action: str, node: int, topic: str, offset: float) -> None:
        # Per node, scheduled times never decrease, so the simulator processes a
        # node's actions in the order the rules issued them.
        at = max(self.s.now + offset, self.last_at[node])
        self.last_at[node] = at
        self.payloads += 1
        payload = f"{node}:{self.payloads}".encode() if action == "PUB" else b""
        self.last_at[node] = self.s.schedule(at, action, node, topic, payload)

    def _pairs(self, subscribed: bool) -> list[tuple[int, str]]:
        return [
            (n, t)
            for t in self.topics
            for n in self.s.ids
            if (n in self.subscribed[t]) == subscribed and n not in self.down
        ]

    @precondition(lambda self: bool(self._pairs(subscribed=False)))
    @rule(data=st.data(), offset=st.sampled_from([0.0, 0.0, 3.0, 150.0]))
    def subscribe(self, data: st.DataObject, offset: float) -> None:
        node, topic = data.draw(st.sampled_from(self._pairs(subscribed=False)), label="sub")
        self.subscribed[topic].add(node)
        self._schedule("SUB", node, topic, offset)

    @precondition(lambda self: bool(self._pairs(subscribed=True)))
    @rule(data=st.data(), offset=st.sampled_from([0.0, 0.0, 3.0, 150.0]))
    def unsubscribe(self, data: st.DataObject, offset: float) -> None:
        node, topic = data.draw(st.sampled_from(self._pairs(subscribed=True)), label="uns")
        self.subscribed[topic].discard(node)
        self._schedule("UNS", node, topic, offset)

    @precondition(lambda self: bool(self._pairs(subscribed=True)))
    @rule(
        data=st.data(),
        offset=st.sampled_from([0.0, 0.0, 1.0, 60.0]),
        count=st.integers(1, 3),
    )
    def publish(self, data: st.DataObject, offset: float, count: int) -> None:
        node, topic = data.draw(st.sampled_from(self._pairs(subscribed=True)), label="pub")
        for _ in range(count):
            self._schedule("PUB", node, topic, offset)

    @precondition(lambda self: len(self._pairs(subscribed=True)) > 1)
    @rule(data=st.data(), topic=st.integers(0, 2))
    def publish_concurrently(self, data: st.DataObject, topic: int) -> None:
        """Several subscribers of a topic publish at the same instant."""
        t = self.topics[topic % len(self.topics)]
        members = sorted(self.subscribed[t])
        if not members:
            return
        who = data.draw(st.lists(st.sampled_from(members), min_size=1, unique=True), label="who")
        for node in who:
            self._schedule("PUB", node, t, 0.0)

    @precondition(lambda self: self.sim is not None and len(self.down) < len(self.s.ids) // 2)
    @rule(data=st.data(), offset=st.sampled_from([0.0, 0.3, 1.0, 40.0, 150.0]))
    def crash(self, data: st.DataObject, offset: float) -> None:
        """A node crashes, often within a ``t_pc`` of its last input (its processing
        window): from that instant it must do nothing (the ``inert`` check)."""
        up = [n for n in self.s.ids if n not in self.down]
        node = data.draw(st.sampled_from(up), label="crash")
        self.down.add(node)
        for subs in self.subscribed.values():
            subs.discard(node)
        self._schedule("CRASH", node, "", offset)

    @precondition(lambda self: bool(self.down))
    @rule(data=st.data(), offset=st.sampled_from([0.0, 1.0, 400.0]))
    def recover(self, data: st.DataObject, offset: float) -> None:
        node = data.draw(st.sampled_from(sorted(self.down)), label="recover")
        self.down.discard(node)
        self._schedule("RECOVER", node, "", offset)

    def _refusals(self) -> list[tuple[float, int, str, str, str]]:
        """Refused calls other than those a crash overtook (the rules cannot know
        when a call scheduled before a crash gets the node's CPU)."""
        return [r for r in self.s.recorder.refusals if "crash" not in r[4]]

    # ------------------------------------------------------------- network

    @precondition(lambda self: self.sim is not None and self.s.pending_events() > 0)
    @rule(count=st.sampled_from([1, 1, 2, 5, 20]))
    def deliver(self, count: int) -> None:
        """Process the next ``count`` events (packets or local calls), one at a time."""
        for _ in range(count):
            self.s.step()

    @precondition(lambda self: self.sim is not None)
    @rule(dt=st.sampled_from([1.0, 50.0, 120.0, 400.0, 2000.0]))
    def advance_time(self, dt: float) -> None:
        self.s.run(until=self.s.now + dt)

    # ------------------------------------------------------------ checking

    @invariant()
    def safety(self) -> None:
        if self.sim is None:
            return
        trace = self.sim.recorder.trace
        self.checker.feed(trace[self.fed :])
        self.fed = len(trace)
        assert_no_violations(self.checker.violations(), "safety")
        assert self._refusals() == [], self._refusals()

    def teardown(self) -> None:
        if self.sim is None:
            return
        sim = self.sim
        sim.run()
        assert sim.quiescent(), "simulation did not quiesce"
        assert self._refusals() == [], self._refusals()
        assert sim.down == self.down
        self.checker.feed(sim.recorder.trace[self.fed :])
        for topic, nodes in self.subscribed.items():
            actual = {n for n in sim.ids if n not in sim.down and sim.nodes[n].is_subscribed(topic)}
            assert actual == nodes, (topic, actual, nodes)
        found = self.checker.violations(quiescent=True) + check_views(sim)
        assert_no_violations(found, "after quiescence")
        pubs = len(sim.recorder.publish_time)
        event("publications", "0" if not pubs else "1-9" if pubs < 10 else "10+")
        event("max messages per round", str(max(sim.recorder.messages_per_round, default=0)))


TestPubSubMachine = PubSubMachine.TestCase
TestPubSubMachine.settings = settings(stateful_step_count=100)  # the rest: active profile


# ---------------------------------------------------------------------------
# Larger random scripts.
# ---------------------------------------------------------------------------


@st.composite
def scripts(draw: st.DrawFn, ids: list[int], topics: list[str]) -> Script:
    """A timed SUB/UNS/PUB script that is legal for every node at every step
    (:func:`p2p.sim.legal_script` of random steps)."""
    return legal_script(draw(raw_steps(ids, topics, horizon=3000, rolls=5)))


def _fewer_examples() -> settings:
    """Half the active profile's examples: each one runs a big network."""
    return settings(max_examples=max(5, settings().max_examples // 2))


@_fewer_examples()
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), ntopics=st.integers(1, 3))
def test_random_scripts(data: st.DataObject, seed: int, ntopics: int) -> None:
    ids = data.draw(populations(8, 40), label="ids")
    topics = [topic_name(k) for k in range(ntopics)]
    script = data.draw(scripts(ids, topics), label="script")
    delay: LinkTable | None = None
    if data.draw(st.booleans(), label="per-link delays"):
        delay = data.draw(link_delays(len(ids)), label="delays")
    sim = new_simulation(ids, seed, delay)
    for time, action, node, topic in script:
        sim.schedule(time, action, node, topic, f"{node}@{time}".encode())
    assert_all_checks(sim)


def _run_fixed(seed: int) -> list[TraceEvent]:
    ids = [5, 17, 1 << 40, 99, (1 << 63) + 3, 64]
    sim = Simulation(ids, seed=seed)
    for k, n in enumerate(ids):
        sim.schedule(10.0 * k, "SUB", n, "a")
        if k % 2:
            sim.schedule(10.0 * k + 1, "SUB", n, "b")
    for k in range(30):
        n = ids[k % len(ids)]
        sim.schedule(800.0 + 7.0 * k, "PUB", n, "a", b"%d" % k)
        if ids.index(n) % 2:
            sim.schedule(800.0 + 7.0 * k, "PUB", n, "b", b"b%d" % k)
    sim.schedule(2000.0, "UNS", ids[3], "a")
    assert_all_checks(sim)
    return list(sim.recorder.trace)


@settings(max_examples=max(3, settings().max_examples // 20))
@given(seed=st.integers(0, 2**32 - 2))
def test_simulation_is_deterministic(seed: int) -> None:
    first = _run_fixed(seed)
    assert _run_fixed(seed) == first
    assert _run_fixed(seed + 1) != first

"""System test: 8 real ``p2p node`` processes, each in its own network namespace.

The namespaces are joined by a bridge in a hub namespace (``tests/_netns.py``),
so nodes find each other by mDNS on a real (virtual) LAN, never on loopback
and never on the host's interfaces.  Every node publishes concurrently; the
traces are checked for causal order, per-source FIFO and exactly-once
delivery (``p2p.sim.check_trace``) and for completeness (:func:`completeness`):
every subscriber delivers, exactly once and in order, every publication made
after its subscription was confirmed, and what it skips is only a prefix of
each source's publications (the ones made before the source learned of the
subscription, which the protocol may skip, see docs/protocol.md).

Needs root and iproute2; fails (does not skip) without them: CI runs as root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from _netns import Lan, alive, leftovers, namespaces, netns_pids, unavailable

from p2p.sim import TraceEvent, check_trace, format_violations

NODES = 8
COUNT = 20
"""Publications per publisher."""
RATE = 5.0
"""Publications per second per publisher (so publishing lasts COUNT / RATE = 4 s)."""
SETTLE = 5.0
"""Seconds of mDNS discovery before subscribing (covers start-up skew on a loaded CI box)."""
DURATION = 15.0
"""Seconds each node runs: start-up, SETTLE, publishing, then time for the last rounds."""
TAIL = 15
"""stderr lines per node shown when an assertion fails."""


@dataclass(frozen=True, slots=True)
class Role:
    """What one node does: publish on one topic, subscribe to others too."""

    publish: str
    subscribe: tuple[str, ...] = ()

    @property
    def topics(self) -> frozenset[str]:
        return frozenset((self.publish, *self.subscribe))


LAYOUTS: dict[str, list[Role]] = {
    # Everybody publishes on one topic at once.
    "one-topic": [Role("chat")] * NODES,
    # 6 publishers on chat (8 subscribers); 2 on news (5 subscribers, 3 outsiders).
    "two-topics": [Role("chat", ("news",))] * 3
    + [Role("chat")] * 3
    + [Role("news", ("chat",))] * 2,
}


@dataclass(frozen=True, slots=True)
class Plan:
    """Who publishes and who subscribes, per topic (node indices)."""

    publishers: dict[str, frozenset[int]]
    subscribers: dict[str, frozenset[int]]
    count: int

    @classmethod
    def of(cls, roles: Sequence[Role], count: int) -> Plan:
        topics = sorted({t for r in roles for t in r.topics})
        pubs = {t: frozenset(i for i, r in enumerate(roles) if r.publish == t) for t in topics}
        subs = {t: frozenset(i for i, r in enumerate(roles) if t in r.topics) for t in topics}
        return cls(pubs, subs, count)


@dataclass(slots=True)
class NodeRun:
    """One node process: identity, where it ran, and its output files."""

    index: int
    node_id: str
    identity: Path
    role: Role
    netns: str = ""
    address: str = ""
    trace: Path = Path()
    stderr: Path = Path()
    returncode: int | None = None


# --------------------------------------------------------------- fleet (CLI)


def _cli(*args: str) -> list[str]:
    """``python -m p2p ARGS...``; its stdout lines (raises with stderr on failure)."""
    proc = subprocess.run(
        [sys.executable, "-m", "p2p", *args], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"p2p {' '.join(args)} failed: {proc.stderr}"
    return proc.stdout.splitlines()


def _cli_all(argvs: Sequence[Sequence[str]]) -> list[list[str]]:
    """Several ``p2p`` commands at once (start-up dominates); their stdout lines."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "p2p", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for argv in argvs
    ]
    outs = []
    for argv, proc in zip(argvs, procs, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"p2p {' '.join(argv)} failed: {err}"
        outs.append(out.splitlines())
    return outs


def make_fleet(root: Path, roles: Sequence[Role], *, psk: bool) -> list[NodeRun]:
    """``p2p fleet init`` + ``add-node`` per node; ids read back with ``fleet show``."""
    fleet = root / "fleet"
    _cli("fleet", "init", str(fleet), *(["--psk"] if psk else []))
    dirs = [root / f"node{i}" for i in range(len(roles))]
    added = _cli_all([("fleet", "add-node", str(fleet), str(d)) for d in dirs])
    shown = _cli_all([("fleet", "show", str(d)) for d in dirs])
    mode = "psk" if psk else "cert"
    nodes = []
    for i, (d, add, show) in enumerate(zip(dirs, added, shown, strict=True)):
        node_id = show[0].split()[0]
        assert add == [f"node {node_id} in {d}"], add
        assert show[0].endswith(f"mode={mode}"), show
        nodes.append(NodeRun(i, node_id, d, roles[i]))
    assert len({n.node_id for n in nodes}) == len(nodes), "node ids collide"
    return nodes


# ----------------------------------------------------------------- running


def node_argv(node: NodeRun) -> list[str]:
    """The ``p2p node`` command line of ``node`` (the CLI contract under test)."""
    subs = [a for t in node.role.subscribe for a in ("--subscribe", t)]
    return [
        sys.executable, "-m", "p2p", "node", "--identity", str(node.identity),
        "--interface", node.address, *subs, "--publish", node.role.publish,
        "--count", str(COUNT), "--rate", str(RATE), "--duration", str(DURATION),
        "--trace", str(node.trace), "--settle", str(SETTLE),
    ]  # fmt: skip


def spawn_nodes(
    net: Lan, nodes: list[NodeRun], out: Path, argv: Callable[[NodeRun], list[str]]
) -> list[subprocess.Popen[bytes]]:
    """Start every node in its host's namespace at once, its output files in ``out``."""
    procs = []
    for node, host in zip(nodes, net.hosts, strict=True):
        node.netns, node.address = host.netns, host.address
        node.trace = out / f"node{node.index}.jsonl"
        node.stderr = out / f"node{node.index}.err"
        with open(out / f"node{node.index}.out", "wb") as so, open(node.stderr, "wb") as se:
            procs.append(net.spawn(host, argv(node), stdout=so, stderr=se))
    return procs


def run_nodes(net: Lan, nodes: list[NodeRun], out: Path) -> None:
    """Start every node in its namespace at once; wait until all have exited."""
    procs = spawn_nodes(net, nodes, out, node_argv)
    deadline = time.monotonic() + DURATION + 45
    for node, proc in zip(nodes, procs, strict=True):
        try:
            node.returncode = proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"node {node.index} still runs {DURATION + 45:.0f} s later\n" + tails(nodes)
            )


def tails(nodes: Sequence[NodeRun]) -> str:
    """The last TAIL stderr lines of every node, for assertion messages."""
    parts = []
    for n in nodes:
        try:
            lines = n.stderr.read_text(errors="replace").splitlines()[-TAIL:]
        except OSError as exc:
            lines = [f"(no stderr: {exc})"]
        head = f"--- node {n.index} {n.node_id} {n.netns} {n.address} exit={n.returncode} ---"
        parts.append("\n".join([head, *lines]))
    return "\n".join(parts)


# ------------------------------------------------------------------ traces


def load_traces(nodes: Sequence[NodeRun]) -> list[TraceEvent]:
    """Every node's trace, in per-node order, hex ids mapped to node indices."""
    index = {n.node_id: n.index for n in nodes}
    events = []
    for n in nodes:
        for line in n.trace.read_text().splitlines():
            row = json.loads(line)
            assert row["node"] == n.node_id, f"{n.trace}: line of another node: {line}"
            source = index[row["source"]] if row["source"] is not None else None
            events.append(
                TraceEvent(row["time"], n.index, row["event"], row["topic"], source, row["seq"])
            )
    return events


def completeness(trace: Sequence[TraceEvent], plan: Plan) -> list[str]:
    """What the trace lacks or repeats, beyond :func:`check_trace`; empty when complete.

    Per topic and source: the source published ``plan.count`` publications;
    every subscriber delivered a *suffix* of them, in order, each once (a
    subscriber may skip only publications made before its subscription
    reached the source), containing every publication made after the
    subscriber's subscription was confirmed (all of them at the source).
    Non-subscribers deliver nothing, non-publishers publish nothing.  And at least a quarter of each
    source's publications were made after *every* subscription was
    confirmed, so the check is never vacuous.
    """
    problems: list[str] = []
    published: dict[tuple[str, int], list[tuple[int, float]]] = defaultdict(list)
    delivered: dict[tuple[int, str, int], list[int]] = defaultdict(list)
    confirmed: dict[tuple[int, str], float] = {}
    for ev in trace:
        if ev.event == "publish" and ev.source is not None and ev.seq is not None:
            published[(ev.topic, ev.source)].append((ev.seq, ev.time))
        elif ev.event == "deliver" and ev.source is not None and ev.seq is not None:
            delivered[(ev.node, ev.topic, ev.source)].append(ev.seq)
        elif ev.event == "subscribed":
            confirmed[(ev.node, ev.topic)] = ev.time
    for topic, pubs in sorted(plan.publishers.items()):
        subs = plan.subscribers[topic]
        missing = [n for n in sorted(subs) if (n, topic) not in confirmed]
        if missing:
            problems.append(f"{topic!r}: subscriptions of nodes {missing} never confirmed")
            continue
        last = max(confirmed[(n, topic)] for n in subs)
        for src in sorted(pubs):
            made = published[(topic, src)]
            problems += _published_ok(topic, src, made, last, plan.count)
            for node in sorted(subs):
                got = delivered[(node, topic, src)]
                since = confirmed[(node, topic)]
                problems += _delivered_ok(topic, src, node, made, got, since)
    stray = sorted(
        {(n, t) for n, t, _ in delivered if n not in plan.subscribers.get(t, frozenset())}
    )
    problems += [f"node {n} delivered on {t!r} without subscribing" for n, t in stray]
    extra = sorted((t, n) for t, n in published if n not in plan.publishers.get(t, frozenset()))
    problems += [f"node {n} published on {t!r}, which it should not" for t, n in extra]
    return problems


def _published_ok(
    topic: str, src: int, made: list[tuple[int, float]], all_subscribed: float, count: int
) -> list[str]:
    """Problems with what ``src`` published on ``topic``."""
    seqs = [s for s, _ in made]
    where = f"{topic!r} source {src}"
    if len(seqs) != count or seqs != list(range(seqs[0], seqs[0] + count)):
        return [f"{where}: published seqs {seqs}, expected {count} consecutive"]
    late = sum(t > all_subscribed for _, t in made)
    if 4 * late < count:
        return [f"{where}: only {late}/{count} publications after all subscribed (start skew?)"]
    return []


def _delivered_ok(
    topic: str, src: int, node: int, made: list[tuple[int, float]], got: list[int], since: float
) -> list[str]:
    """Problems with ``node``'s deliveries from ``src``; ``since``: its confirmation
    time (the source itself must deliver all its publications)."""
    where = f"node {node}, {topic!r} from {src}"
    seqs = [s for s, _ in made]
    problems = []
    dup = sorted({s for s in got if got.count(s) > 1})
    if dup:
        problems.append(f"{where}: delivered seqs {dup} more than once")
    required = seqs if node == src else [s for s, t in made if t > since]
    lost = sorted(set(required) - set(got))
    if lost:
        problems.append(f"{where}: never delivered {lost} (published after it subscribed)")
    if got != seqs[len(seqs) - len(got) :]:
        problems.append(f"{where}: delivered {got}, not an in-order suffix of {seqs}")
    return problems


def trace_problems(trace: Sequence[TraceEvent], plan: Plan) -> list[str]:
    """Causal order, FIFO, exactly-once and liveness (``check_trace``) plus completeness."""
    violations = check_trace(trace, quiescent=True)
    found = [format_violations(violations)] if violations else []
    return found + completeness(trace, plan)


def node_problems(nodes: Sequence[NodeRun]) -> list[str]:
    """Exit codes, discovery (every node found all peers by mDNS) and errors logged."""
    problems = []
    for n in nodes:
        err = n.stderr.read_text(errors="replace")
        if n.returncode != 0:
            problems.append(f"node {n.index} exited with {n.returncode}")
        if f"p2p node: {len(nodes) - 1} peers found" not in err:
            problems.append(f"node {n.index} did not find all {len(nodes) - 1} peers by mDNS")
        if f"p2p node: published {COUNT} on {n.role.publish!r}" not in err:
            problems.append(f"node {n.index} did not finish publishing")
        if "Traceback" in err or " ERROR " in err:
            problems.append(f"node {n.index} logged an error or a traceback")
    return problems


# ----------------------------------------------------------- trace mutations


def _deliveries(trace: Sequence[TraceEvent], node: int) -> list[int]:
    """Positions in ``trace`` of ``node``'s deliveries of other nodes' publications."""
    return [
        i for i, e in enumerate(trace)
        if e.node == node and e.event == "deliver" and e.source != node
    ]  # fmt: skip


def drop_last_delivery(trace: list[TraceEvent], node: int) -> list[TraceEvent]:
    """``trace`` without ``node``'s last delivery of a remote publication."""
    i = _deliveries(trace, node)[-1]
    return trace[:i] + trace[i + 1 :]


def duplicate_delivery(trace: list[TraceEvent], node: int) -> list[TraceEvent]:
    """``trace`` with ``node``'s last remote delivery repeated right after itself."""
    i = _deliveries(trace, node)[-1]
    return [*trace[: i + 1], replace(trace[i], time=trace[i].time + 1e-6), *trace[i + 1 :]]


def swap_same_source(trace: list[TraceEvent], node: int) -> list[TraceEvent]:
    """``trace`` with two of ``node``'s deliveries from one source exchanged."""
    pos = _deliveries(trace, node)
    i = pos[0]
    j = next(k for k in pos[1:] if trace[k].source == trace[i].source)
    out = list(trace)
    out[i], out[j] = trace[j], trace[i]
    return out


Key = tuple[str, int | None, int | None]
"""``(topic, source, seq)`` of a publication."""


def break_causality(trace: list[TraceEvent], node: int) -> list[TraceEvent]:
    """Move a delivery of ``m1`` at ``node`` after its delivery of an ``m2`` of the
    same topic, another source, whose publisher had delivered ``m1`` before
    publishing ``m2`` (so ``m1 -> m2``: causal order is per topic)."""
    seen: dict[int, set[Key]] = defaultdict(set)
    past: dict[Key, set[Key]] = {}
    for e in trace:  # only per-node order matters, and each node's events are in order
        if e.event == "deliver" and e.source != e.node:
            seen[e.node].add(_key(e))
        elif e.event == "publish":
            past[_key(e)] = set(seen[e.node])
    pos = _deliveries(trace, node)
    for a in pos:
        m1 = _key(trace[a])
        for b in pos[pos.index(a) + 1 :]:
            m2 = _key(trace[b])
            if m2[0] == m1[0] and m2[1] != m1[1] and m1 in past.get(m2, ()):
                return [*trace[:a], *trace[a + 1 : b + 1], trace[a], *trace[b + 1 :]]
    raise AssertionError(f"no causally related pair of deliveries at node {node}")


def _key(e: TraceEvent) -> Key:
    return (e.topic, e.source, e.seq)


def assert_checks_catch_mutations(trace: list[TraceEvent], plan: Plan, node: int) -> None:
    """Each way of breaking ``trace`` at ``node`` is reported by ``check_trace`` and,
    where it is about completeness or exactly-once, by :func:`completeness` too."""
    cases = {
        "drop": (drop_last_delivery, "liveness", "never delivered"),
        "duplicate": (duplicate_delivery, "duplicate", "more than once"),
        "fifo": (swap_same_source, "fifo", "not an in-order suffix"),
        "causal": (break_causality, "causal", ""),
    }
    for name, (mutate, kind, ours) in cases.items():
        broken = mutate(trace, node)
        kinds = {v.kind for v in check_trace(broken, quiescent=True)}
        assert kind in kinds, f"mutation {name!r} at node {node}: check_trace found {kinds}"
        found = "\n".join(completeness(broken, plan))
        assert ours in found, f"mutation {name!r} at node {node}: completeness found {found!r}"


# ------------------------------------------------------------------- tests


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("psk", "layout"), [(True, "one-topic"), (False, "two-topics")], ids=["psk", "cert"]
)
def test_nodes_in_namespaces_find_each_other_and_deliver_in_causal_order(
    lan: Lan, tmp_path: Path, psk: bool, layout: str
) -> None:
    """8 namespaces on a bridge, mDNS discovery, concurrent publishers; traces checked."""
    roles = LAYOUTS[layout]
    nodes = make_fleet(tmp_path, roles, psk=psk)
    run_nodes(lan, nodes, tmp_path)
    problems = node_problems(nodes)
    assert not problems, "\n".join([*problems, tails(nodes)])
    trace = load_traces(nodes)
    plan = Plan.of(roles, COUNT)
    problems = trace_problems(trace, plan)
    assert not problems, "\n".join([*problems, tails(nodes)])
    assert_checks_catch_mutations(trace, plan, node=NODES - 1)


@pytest.mark.slow
def test_lan_teardown_removes_namespaces_links_and_processes(tmp_path: Path) -> None:
    """A failing test body still leaves no namespace, link or process behind,
    not even a process that left its process group (found by ``ip netns pids``)."""
    reason = unavailable()
    if reason is not None:
        pytest.fail(reason)
    net = Lan(2)
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="simulated failure"):
        _start_processes_then_fail(net, tmp_path / "out", pids)
    assert leftovers(net.suffix) == []
    assert len(pids) == 2, pids
    assert not [p for p in pids if alive(p)], "processes survived teardown"
    assert set(pids) <= net.killed


def _start_processes_then_fail(net: Lan, out: Path, pids: list[int]) -> None:
    """Inside ``net``: start a process, and one that escapes its process group; fail."""
    with net, open(out, "wb") as log:
        assert len([n for n in namespaces() if net.suffix in n]) == 3  # hub + 2 hosts
        net.spawn(net.hosts[0], ["sleep", "300"], stdout=log, stderr=log)
        detach = "setsid sleep 300 </dev/null >/dev/null 2>&1 &"
        net.spawn(net.hosts[1], ["sh", "-c", detach], stdout=log, stderr=log).wait(10)
        pids += _wait_for_pids(net, 2)
        raise RuntimeError("simulated failure")


def _wait_for_pids(net: Lan, count: int) -> list[int]:
    """The pids in ``net``'s host namespaces, once there are ``count`` of them, each
    leading its own process group: the escaping one has run ``setsid`` by then
    (taken before it, teardown's signal to the group it was leaving killed it,
    and the test could not tell whether the namespace sweep works)."""
    deadline = time.monotonic() + 10
    while True:
        pids = [p for h in net.hosts for p in netns_pids(h.netns)]
        settled = len(pids) >= count and all(_leads_its_group(p) for p in pids)
        if settled or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def _leads_its_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def test_trace_checks_report_broken_traces() -> None:
    """The completeness and trace checks on a small hand-made run (no root needed)."""
    plan = Plan.of([Role("t")] * 3, count=2)
    trace = _synthetic_run()
    assert trace_problems(trace, plan) == []
    for node in (1, 2):
        assert_checks_catch_mutations(trace, plan, node)
    late = [e for e in trace if not (e.node == 2 and e.event == "subscribed")]
    assert "never confirmed" in "\n".join(completeness(late, plan))
    short = Plan.of([Role("t")] * 3, count=3)
    assert "expected 3 consecutive" in "\n".join(completeness(trace, short))
    two = Plan.of([Role("t"), Role("t"), Role("u", ("t",))], count=2)
    assert "published on 't', which it should not" in "\n".join(completeness(trace, two))


def _synthetic_run() -> list[TraceEvent]:
    """3 nodes subscribe to ``t``; each publishes 2 after delivering what came before."""
    out: list[TraceEvent] = []
    for n in range(3):
        out += [TraceEvent(0.0, n, "subscribe", "t", None, None)]
        out += [TraceEvent(1.0, n, "subscribed", "t", None, None)]
    order = [(0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 2)]  # the global publication order
    for n in range(3):
        for step, (src, seq) in enumerate(order):
            t = 2.0 + step
            if src == n:
                out.append(TraceEvent(t, n, "publish", "t", src, seq))
            out.append(TraceEvent(t, n, "deliver", "t", src, seq))
    return out

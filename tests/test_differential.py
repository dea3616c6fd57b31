"""One scenario, two drivers: the trio runtime and the simulator agree.

DESIGN.md §1: both drivers run the same ``NodeMachine``.  This test runs one
scripted scenario through real nodes on loopback (the runtime's driver,
real TCP and crypto) and through the simulator, and compares what each node
delivered (per source, in order) and the membership events of the members:

    four nodes meet through node 0 (a seed) and subscribe; each publishes;
    node 3 crashes; the others publish; node 3 restarts from its directory
    (its frontier kept) and resumes what it missed; every connection of
    nodes 0 and 1 is reset, and both publish; node 2 is revoked; the
    others publish.

The runtime waits for each step to settle before the next, and the
simulator spaces the steps far apart, so neither timing decides what is
delivered: any difference is a difference of the drivers.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import trio
from test_node_failures import Cluster, _collect, _config, _fleet, _until

from p2p._identity import load_fleet_authority
from p2p._revocation import revoke
from p2p.runtime import Delivery, Node
from p2p.sim import DETECTOR, Simulation

N = 4
PHASES = 40_000.0
"""Simulated time between steps (u.t.): far more than any step takes to settle."""

Deliveries = dict[int, dict[int, list[str]]]
"""Per node, per source (indices), the payloads delivered in order."""
Events = dict[int, set[tuple[str, int, str]]]
"""Per member node, its membership events ``(kind, about, reason)`` after the start."""


def _steps() -> list[tuple[str, list[int]]]:
    """The scenario: ``("pub", nodes)``, ``("crash", [3])``, ... in order."""
    return [
        ("pub", [0, 1, 2, 3]),
        ("crash", [3]),
        ("pub", [0, 1, 2]),
        ("restart", [3]),
        ("reset", [0, 1]),
        ("pub", [0, 1]),
        ("revoke", [2]),
        ("pub", [0, 1, 3]),
    ]


def _payload(node: int, step: int, k: int) -> str:
    return f"{node}-{step}-{k}"


# ------------------------------------------------------------------ simulator


def _simulate() -> tuple[Deliveries, Events]:
    ids = list(range(N))
    sim = Simulation(ids, seed=7, detector=DETECTOR, introductions={k: {0} for k in ids[1:]})
    payloads: dict[int, list[str]] = defaultdict(list)
    for n in ids:
        sim.schedule(PHASES / 2, "SUB", n, "t")
    at = PHASES
    for step, (what, nodes) in enumerate(_steps()):
        for n in nodes:
            if what == "pub":
                for k in range(2):
                    p = _payload(n, step, k)
                    payloads[n].append(p)
                    sim.schedule(at + 10.0 * k + n, "PUB", n, "t", p.encode())
            elif what == "crash":
                sim.schedule(at, "CRASH", n, "")
            elif what == "restart":
                sim.schedule(at, "RESTART", n, "")
                sim.schedule(at + 1.0, "SUB", n, "t")
            elif what == "reset":
                for other in ids:
                    if other != n and not (other in nodes and other < n):
                        sim.schedule(at, "RESET", n, str(other))
            elif what == "revoke":
                sim.schedule(at, "REVOKE", 0, str(n))
        at += PHASES
    sim.run()
    order: dict[int, dict[int, str]] = defaultdict(dict)  # (source, seq) -> payload
    for e in sim.recorder.trace:
        if e.event == "publish":
            assert e.source is not None
            assert e.seq is not None
            order[e.source][e.seq] = payloads[e.source][len(order[e.source])]
    got: Deliveries = {n: defaultdict(list) for n in ids}
    for e in sim.recorder.trace:
        if e.event == "deliver":
            assert e.source is not None
            assert e.seq is not None
            got[e.node][e.source].append(order[e.source][e.seq])
    events: Events = {n: set() for n in ids}
    for time, node, kind, about, reason in sim.membership_events():
        if time > PHASES / 2:
            events[node].add((kind, about, reason))
    return got, events


# -------------------------------------------------------------------- runtime


async def _run_real(tmp_path: Path) -> tuple[Deliveries, Events]:
    idents = _fleet(tmp_path, N)
    follow = tmp_path / "n0-revoked.cbor"
    got: Deliveries = {n: defaultdict(list) for n in range(N)}
    events: Events = {n: set() for n in range(N)}
    async with trio.open_nursery() as nursery:
        c = Cluster(nursery, idents)

        def cfg(i: int, seed: int | None) -> object:
            extra: dict[str, object] = {"frontier_file": tmp_path / f"n{i}" / "frontier"}
            if i == 0:
                extra["revocation_file"] = follow
            return _config(seed, **extra)

        first = await c.start(0, cfg(0, None))  # type: ignore[arg-type]
        for i in range(1, N):
            await c.start(i, cfg(i, first.port))  # type: ignore[arg-type]
        await _until(lambda: all(len(x.members()) == N for x in c.alive()), 20, "membership")
        index = {node.id: i for i, node in c.nodes.items()}

        async def watch(i: int, node: Node) -> None:
            async with node.membership() as stream:
                async for ev in stream:
                    events[i].add((ev.kind, index[ev.node], ev.reason))

        async def attend(i: int, node: Node) -> None:
            """Subscribe ``node`` (index ``i``) and collect what it delivers."""
            nursery.start_soon(watch, i, node)
            mine: list[Delivery] = []
            nursery.start_soon(_collect, await node.subscribe("t"), mine)
            nursery.start_soon(_sort, mine, i)

        async def _sort(mine: list[Delivery], i: int) -> None:
            seen = 0
            while True:
                await trio.sleep(0.01)
                for d in mine[seen:]:
                    got[i][index[d.source]].append(d.payload.decode())
                seen = len(mine)

        for i, node in list(c.nodes.items()):
            await attend(i, node)
        members = set(range(N))
        made: dict[int, int] = defaultdict(int)  # per source, publications made

        for step, (what, nodes) in enumerate(_steps()):
            if what == "pub":
                for n in nodes:
                    for k in range(2):
                        await c.nodes[n].publish("t", _payload(n, step, k).encode())
                        made[n] += 1
                await _until(lambda: _all_delivered(got, members, made), 30, f"step {step}")
            elif what == "crash":
                (n,) = nodes
                c.kill(n)
                members.discard(n)
                await _until(lambda: _members_are(c, members), 30, "the crash to be seen")
            elif what == "restart":
                (n,) = nodes
                node = await c.start(n, cfg(n, first.port))  # type: ignore[arg-type]
                index[node.id] = n
                members.add(n)
                await attend(n, node)
                await _until(lambda: all(len(x.members()) == len(members) for x in c.alive())
                             and _all_delivered(got, members, made), 30, "the restart")  # fmt: skip
            elif what == "reset":
                ports = [c.nodes[n].port for n in nodes]
                match = " or ".join(f"sport = :{p} or dport = :{p}" for p in ports)
                await trio.run_process(["ss", "-K", "-t", "state", "established", f"( {match} )"],
                                       capture_stdout=True)  # fmt: skip
            elif what == "revoke":
                (n,) = nodes
                authority = load_fleet_authority(tmp_path / "fleet")
                follow.write_bytes(revoke(authority, None, {c.nodes[n].id}).encode())
                members.discard(n)
                await _until(lambda: _members_are(c, members), 30, "the revocation")
        await trio.sleep(0.5)  # the last deliveries sorted
        nursery.cancel_scope.cancel()
    return got, events


def _members_are(c: Cluster, members: set[int]) -> bool:
    """Every node of ``members`` holds exactly ``members`` as the members."""
    want = {c.nodes[m].id for m in members}
    return all(set(c.nodes[m].members()) == want for m in members)


def _all_delivered(got: Deliveries, members: set[int], made: dict[int, int]) -> bool:
    """Every member delivered every publication made (its own included)."""
    return all(len(got[i][s]) >= made[s] for i in members for s in made)


def test_the_runtime_and_the_simulator_deliver_and_see_the_same(tmp_path: Path) -> None:
    sim_got, sim_events = _simulate()
    real_got, real_events = trio.run(_run_real, tmp_path)
    for i in range(N):
        assert dict(real_got[i]) == dict(sim_got[i]), f"node {i} delivered differently"
    for i in (0, 1):  # the members that ran throughout (node 3 restarted, node 2 revoked)
        assert real_events[i] == sim_events[i], f"node {i} saw membership differently"
    assert ("left", 2, "revoked") in real_events[0]
    assert ("left", 3, "suspected") in real_events[1]

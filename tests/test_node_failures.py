"""Real nodes on loopback losing members: the failure detector wired to the core.

Nodes find each other through static seeds (no mDNS), run the VCube failure
detector with 0.2 s rounds, and are killed abruptly by cancelling the scope
that runs them: their sockets close without the graceful leave a clean close
announces, as when a process is killed.  Every test cancels everything it
started (trio scopes), even on failure.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import trio

from p2p._identity import Fleet, NodeIdentity, add_node, init_fleet, load_node
from p2p._secure import SecureSession
from p2p.runtime import Delivery, MembershipEvent, Node, NodeConfig, NodeError, open_node
from p2p.sim import TraceEvent, check_trace, format_violations
from p2p.wire import encode_packets, frame

INTERVAL = 0.2
DETECT_BOUND = 10.0
"""Loose bound on detection (the detector needs a few rounds; CI hosts are slow)."""

Ident = tuple[NodeIdentity, Fleet]
_IGNORED = trio.TASK_STATUS_IGNORED


def _fleet(tmp_path: Path, n: int) -> list[Ident]:
    init_fleet(tmp_path / "fleet", psk=True)
    out = []
    for i in range(n):
        add_node(tmp_path / "fleet", tmp_path / f"n{i}", name=f"n{i}")
        out.append(load_node(tmp_path / f"n{i}"))
    return out


def _config(seed_port: int | None, **kw: object) -> NodeConfig:
    seeds = () if seed_port is None else (f"127.0.0.1:{seed_port}",)
    settings: dict[str, object] = {"detector_interval": INTERVAL, **kw}
    return NodeConfig(
        discovery=False,
        seeds=seeds,
        seed_interval=1.0,
        drain_timeout=0.5,
        **settings,  # type: ignore[arg-type]
    )


class Cluster:
    """Nodes each run in a cancel scope of their own: ``kill`` cancels it (no leave)."""

    def __init__(self, nursery: trio.Nursery, idents: list[Ident]) -> None:
        self.nursery = nursery
        self.idents = idents
        self.nodes: dict[int, Node] = {}
        self.scopes: dict[int, trio.CancelScope] = {}
        self.stops: dict[int, trio.Event] = {}
        self.trace: list[TraceEvent] = []
        self.index: dict[int, int] = {}

    def _hook(self, i: int) -> Callable[[str, str, int | None, int | None, int], None]:
        def record(event: str, topic: str, source: int | None, seq: int | None, inc: int) -> None:
            src = self.index[source] if source is not None else None
            self.trace.append(TraceEvent(trio.current_time(), i, event, topic, src, seq))

        return record

    async def start(self, i: int, cfg: NodeConfig) -> Node:
        """Start node ``i``; returns once it listens."""
        node: Node = await self.nursery.start(self._run, i, cfg)
        self.index[node.id] = i
        return node

    async def _run(
        self, i: int, cfg: NodeConfig, *, task_status: trio.TaskStatus[Node] = _IGNORED
    ) -> None:
        with trio.CancelScope() as scope:
            self.scopes[i] = scope
            stop = self.stops[i] = trio.Event()
            async with open_node(self.idents[i], cfg, trace=self._hook(i)) as node:
                self.nodes[i] = node
                task_status.started(node)
                await stop.wait()

    def kill(self, i: int) -> None:
        """Abrupt end of node ``i``: sockets closed, nothing announced."""
        self.trace.append(TraceEvent(trio.current_time(), i, "crash", "", None, None))
        self.scopes[i].cancel()
        del self.nodes[i]

    def alive(self) -> list[Node]:
        return list(self.nodes.values())


async def _start(c: Cluster, n: int, **kw: object) -> list[Node]:
    """Node 0 first (the seed), then the others; wait until all know all."""
    first = await c.start(0, _config(None, **kw))
    for i in range(1, n):
        await c.start(i, _config(first.port, **kw))
    await _until(lambda: all(len(x.members()) == n for x in c.alive()), 20, "membership")
    return c.alive()


async def _until(cond: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``cond`` every 20 ms; the seconds it took.  Fails with ``what`` on timeout."""
    start = trio.current_time()
    with trio.move_on_after(timeout):
        while not cond():
            await trio.sleep(0.02)
        return trio.current_time() - start
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def _collect(sub: object, out: list[Delivery]) -> None:
    async for d in sub:  # type: ignore[attr-defined]
        out.append(d)


def _payloads(ds: list[Delivery], source: int) -> list[bytes]:
    return [d.payload for d in ds if d.source == source]


async def _killed_subscriber_scenario(tmp_path: Path, *, detector: bool) -> float:
    """Five subscribers, node 4 killed; returns how long node 0's next publication
    took to reach every survivor (``AssertionError`` if it stalls for 8 s)."""
    idents = _fleet(tmp_path, 5)
    async with trio.open_nursery() as nursery:
        c = Cluster(nursery, idents)
        nodes = await _start(c, 5, detector=detector)
        got: dict[int, list[Delivery]] = defaultdict(list)
        with trio.fail_after(20):
            for i, node in enumerate(nodes):
                nursery.start_soon(_collect, await node.subscribe("t"), got[i])
        victim = nodes[4].id
        c.kill(4)
        if detector:
            took = await _until(
                lambda: all(victim not in n.members() for n in c.alive()),
                DETECT_BOUND,
                "every survivor to suspect the killed node",
            )
            assert took < DETECT_BOUND
        start = trio.current_time()
        with trio.move_on_after(8) as stalled:
            await nodes[0].publish("t", b"after", wait_acked=True)
            delivered = lambda: all(b"after" in [d.payload for d in got[i]] for i in range(4))  # noqa: E731
            await _until(delivered, 8, "delivery to every survivor")
        elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    if stalled.cancelled_caught:
        raise AssertionError("the publication after the kill stalled")
    violations = check_trace(c.trace, quiescent=True)
    assert not violations, format_violations(violations)
    return elapsed


def test_killed_subscriber_is_detected_and_publications_flow(tmp_path: Path) -> None:
    """(a) A killed non-publishing subscriber leaves every survivor's overlay within
    the bound, and the next publication reaches every survivor (checked trace)."""
    elapsed = trio.run(partial(_killed_subscriber_scenario, tmp_path, detector=True))
    assert elapsed < 8


def test_without_the_detector_a_killed_subscriber_stalls_publications(tmp_path: Path) -> None:
    """The scenario of (a) is a real test: without the detector the round that
    waits for the dead node's ACK never completes."""
    with pytest.raises(AssertionError, match="stalled"):
        trio.run(partial(_killed_subscriber_scenario, tmp_path, detector=False))


def test_publisher_killed_mid_stream_survivors_agree(tmp_path: Path) -> None:
    """(b) A publisher killed while publishing: survivors delivered the same set of
    its publications, each at most once and in its order, while node 0 keeps
    publishing; the runtime trace passes every checker invariant."""
    idents = _fleet(tmp_path, 5)
    got: dict[int, list[Delivery]] = defaultdict(list)
    ids: dict[int, int] = {}

    async def publish_forever(node: Node, tag: bytes) -> None:
        i = 0
        while True:
            await node.publish("t", tag + str(i).encode())
            i += 1
            await trio.sleep(0.01)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            c = Cluster(nursery, idents)
            nodes = await _start(c, 5)
            ids.update({i: n.id for i, n in enumerate(nodes)})
            with trio.fail_after(20):
                for i, node in enumerate(nodes):
                    nursery.start_soon(_collect, await node.subscribe("t"), got[i])
            async with trio.open_nursery() as pubs:
                pubs.start_soon(publish_forever, nodes[3], b"v")
                await _until(lambda: len(_payloads(got[0], ids[3])) >= 20, 20, "victim traffic")
                c.kill(3)
                pubs.cancel_scope.cancel()
            victim = ids[3]
            await _until(
                lambda: all(victim not in n.members() for n in c.alive()), DETECT_BOUND, "detection"
            )
            with trio.fail_after(15):
                for k in range(20):
                    await nodes[0].publish("t", b"p" + str(k).encode(), wait_acked=k == 19)
            await _until(
                lambda: all(len(_payloads(got[i], ids[0])) == 20 for i in (0, 1, 2, 4)), 10, "p"
            )
            nursery.cancel_scope.cancel()
        survivors = (0, 1, 2, 4)
        sets = [set(_payloads(got[i], ids[3])) for i in survivors]
        assert all(s == sets[0] for s in sets), "survivors disagree on the victim's messages"
        assert len(sets[0]) >= 20
        for i in survivors:
            keys = [(d.source, d.incarnation, d.seq) for d in got[i]]
            assert len(keys) == len(set(keys)), "duplicate delivery"
            for src in (ids[0], ids[3]):
                seqs = [d.seq for d in got[i] if d.source == src]
                assert seqs == sorted(seqs), "per-source FIFO broken"
        violations = check_trace(c.trace, quiescent=True)
        assert not violations, format_violations(violations)

    trio.run(main)


def test_killed_node_restarts_as_new_incarnation_and_receives(tmp_path: Path) -> None:
    """(c) A killed node restarted with the same identity (and port) comes back as
    a higher incarnation: survivors see it leave and rejoin as ``restarted``, it
    resubscribes and receives, and the survivors' rounds include it."""
    idents = _fleet(tmp_path, 4)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            c = Cluster(nursery, idents)
            nodes = await _start(c, 4)
            events: list[MembershipEvent] = []

            async def watch(node: Node) -> None:
                async with node.membership() as ev:
                    async for e in ev:
                        events.append(e)

            nursery.start_soon(watch, nodes[0])
            with trio.fail_after(20):
                for node in nodes:
                    await node.subscribe("t")
            old_inc, port, victim = nodes[3].incarnation, nodes[3].port, nodes[3].id
            c.kill(3)
            await _until(lambda: all(victim not in n.members() for n in c.alive()), 10, "suspicion")
            back = await c.start(3, _config(nodes[0].port, port=port))
            assert back.incarnation > old_inc
            await _until(lambda: all(victim in n.members() for n in c.alive()), 10, "rejoin")
            got: list[Delivery] = []
            with trio.fail_after(20):
                nursery.start_soon(_collect, await back.subscribe("t"), got)
                await nodes[0].publish("t", b"welcome back", wait_acked=True)
            await _until(lambda: [d.payload for d in got] == [b"welcome back"], 10, "delivery")
            reasons = [(e.kind, e.reason, e.incarnation) for e in events if e.node == victim]
            assert ("left", "suspected", old_inc) in reasons
            assert ("joined", "restarted", back.incarnation) in reasons
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_malformed_detector_packet_closes_only_that_connection(tmp_path: Path) -> None:
    """(d) A fleet member sending a malformed detector packet gets its connection
    closed with a log line; the node keeps serving honest peers."""
    idents = _fleet(tmp_path, 3)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            c = Cluster(nursery, idents)
            a, b = await _start(c, 2)
            rejected = a.stats["rejected_connections"]
            # Node 2's identity, speaking garbage by hand: [4, [0, 1]] is no detector message.
            identity, fleet = idents[2]
            stream = await trio.open_tcp_stream("127.0.0.1", a.port)
            session = SecureSession.initiator(identity, fleet)
            await stream.send_all(frame(session.start()))
            from p2p._transport import Messages as _Messages

            messages = _Messages(stream, 1 << 16)
            await messages.handshake(session)
            body = encode_packets([])[:-1] + b"\x81\x82\x04\x82\x00\x01"
            await stream.send_all(frame(session.seal(body)))
            await _until(lambda: a.stats["rejected_connections"] > rejected, 5, "rejection")
            with trio.fail_after(5):
                assert await stream.receive_some(100) == b""  # closed by a
            await stream.aclose()
            with trio.fail_after(20):
                sa, sb = await a.subscribe("t"), await b.subscribe("t")
                await b.publish("t", b"still here", wait_acked=True)
                assert (await sa.receive()).payload == b"still here"
                assert (await sb.receive()).payload == b"still here"
            assert a.members() == {a.id, b.id}
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_clean_close_announces_leave_not_suspicion(tmp_path: Path) -> None:
    """A node that closes cleanly is forgotten at once as ``left``, never suspected."""
    idents = _fleet(tmp_path, 3)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            c = Cluster(nursery, idents)
            nodes = await _start(c, 3)
            events: list[MembershipEvent] = []

            async def watch() -> None:
                async with nodes[0].membership() as ev:
                    async for e in ev:
                        events.append(e)

            nursery.start_soon(watch)
            await trio.sleep(0)
            victim = nodes[2].id
            c.stops[2].set()
            await _until(lambda: victim not in nodes[0].members(), 5, "leave")
            assert [(e.kind, e.reason) for e in events if e.node == victim] == [("left", "left")]
            assert nodes[0].stats["suspicions"] == 0
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_detector_settings_are_validated() -> None:
    with pytest.raises(NodeError):
        NodeConfig(detector_interval=0)
    with pytest.raises(NodeError):
        NodeConfig(detector_interval=1.0, detector_timeout=2.0)
    with pytest.raises(NodeError):
        NodeConfig(detector_attempts=0)
    assert dataclasses.replace(NodeConfig(), detector=False).detector is False


SLOW_ROUNDS = 30.0
"""Detector rounds this far apart: only a hint can make a probe leave in between."""


def test_broken_connection_makes_survivors_probe_at_once(tmp_path: Path) -> None:
    """The transport's hint: with 30 s detector rounds, a killed node is still
    suspected within seconds, because a peer whose connection to it broke (and
    cannot be re-dialled) probes it at once; the suspicion itself takes two
    unanswered probes of 0.3 s, and is pushed to the nodes with no link to it.
    Without the hint, nobody would probe before the next round, 30 s away."""
    idents = _fleet(tmp_path, 4)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            c = Cluster(nursery, idents)
            slow = {"detector_timeout": 0.3, "detector_attempts": 2}
            await _start(c, 4, detector_interval=SLOW_ROUNDS, **slow)
            with trio.fail_after(20):  # SUB rounds open links along every tree
                for node in c.alive():
                    await node.subscribe("t")
            victim = c.nodes[3].id
            c.kill(3)
            took = await _until(
                lambda: all(victim not in n.members() for n in c.alive()), 5, "suspicion"
            )
            assert took >= 0.6 - 0.05  # two probes of 0.3 s, no shortcut
            for node in c.alive():
                assert node.stats["suspicions"] == 1
                assert node.stats["reincarnations"] == 0
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_hint_about_a_live_peer_probes_it_and_suspects_nothing(tmp_path: Path) -> None:
    """A hint is only a probe: it leaves at once, the live peer answers it,
    and nobody is suspected."""
    idents = _fleet(tmp_path, 3)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            c = Cluster(nursery, idents)
            slow = {"detector_timeout": 0.2, "detector_attempts": 1}
            a, b, _ = await _start(c, 3, detector_interval=SLOW_ROUNDS, **slow)
            assert a.detector is not None
            probes = a.detector.stats.probes
            a._unreachable(b.id)
            assert a.detector.stats.probes == probes + 1  # at once, not at the next round
            await _until(lambda: a.detector.deadline() is None, 2, "the answer")  # type: ignore[union-attr]
            await trio.sleep(0.5)
            assert a.members() == {x.id for x in c.alive()}
            assert a.stats["suspicions"] == 0
            assert a.detector.stats.timeouts == 0
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_data_frames_carry_the_detector_version_and_spare_probes(tmp_path: Path) -> None:
    """Piggybacking: every frame carries its sender's detector version, so while
    publications and their ACKs flow between two nodes neither probes the other
    (their traffic shows a version already synced); once the traffic stops,
    probes resume: about one per round between the two, since a probe is itself
    a sign of life to the node it reaches."""
    idents = _fleet(tmp_path, 2)

    def probes(nodes: list[Node]) -> int:
        return sum(n.detector.stats.probes for n in nodes if n.detector is not None)

    async def publish(node: Node, until: float) -> None:
        while trio.current_time() < until:
            await node.publish("t", b"x")
            await trio.sleep(0.02)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            c = Cluster(nursery, idents)
            a, b = await _start(c, 2)
            got: list[Delivery] = []
            with trio.fail_after(20):
                for node in (a, b):
                    nursery.start_soon(_collect, await node.subscribe("t"), got)
            busy_end = trio.current_time() + 3.0
            nursery.start_soon(publish, a, busy_end)
            await trio.sleep(1.0)  # the versions of the join settle
            before = probes([a, b])
            await trio.sleep(busy_end - trio.current_time())
            busy = probes([a, b]) - before
            await trio.sleep(0.5)
            before = probes([a, b])
            await trio.sleep(2.0)  # 10 rounds
            idle = probes([a, b]) - before
            assert busy <= 2, f"{busy} probes in 10 rounds of traffic"
            assert idle >= 5, f"only {idle} probes in 10 idle rounds"
            assert len(got) >= 2 * 50  # both delivered a steady stream
            assert a.stats["suspicions"] == b.stats["suspicions"] == 0
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_node_closed_before_its_seed_answered_still_leaves(tmp_path: Path) -> None:
    """A seed-only node closed the moment its seed learnt it (the seed's own record
    still on its way back) tells the seed it leaves: ``left``, never a suspicion."""
    idents = _fleet(tmp_path, 2)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            c = Cluster(nursery, idents)
            seed = await c.start(0, _config(None))
            events: list[MembershipEvent] = []

            async def watch() -> None:
                async with seed.membership() as ev:
                    async for e in ev:
                        events.append(e)
                        if e.kind == "joined":
                            c.stops[1].set()  # before anything else runs on this loop

            nursery.start_soon(watch)
            await trio.sleep(0)
            joiner = await c.start(1, _config(seed.port))
            await _until(lambda: any(e.kind == "left" for e in events), 10, "the joiner's end")
            seen = [(e.kind, e.reason) for e in events]
            assert seen == [("joined", "discovered"), ("left", "left")]
            assert joiner.id not in seed.members()
            assert seed.stats["suspicions"] == 0
            nursery.cancel_scope.cancel()

    trio.run(main)

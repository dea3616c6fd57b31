"""Real nodes on loopback: TCP, the fleet's secure channel and mDNS discovery."""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing
from _telemetry import read_records

from causal import MsgId
from p2p._errors import SecurityError
from p2p._identity import Fleet, NodeIdentity, add_node, init_fleet, load_node
from p2p._membership import Peer
from p2p._secure import sign_record
from p2p.machine import ENVELOPE_SIZE
from p2p.runtime import (
    Delivery,
    Node,
    NodeConfig,
    NodeError,
    Subscription,
    open_node,
    parse_address,
)
from p2p.runtime._config import TraceHook
from p2p.runtime._delivery import _STAMP, DELIVERY_BATCH, _new_delivery
from p2p.runtime._link import _Link
from p2p.runtime._node import PUBLISH_BATCH, _settle_heap
from p2p.sim import TraceEvent, check_trace, format_violations
from p2p.telemetry import bucket
from p2p.wire import PeerExchange, WireLimits, decode_frame, decode_packets, encode_packets, frame
from topics import (
    Delivered,
    DeliveredRun,
    PublishedRun,
    PubMessage,
    PubRound,
    Received,
    RoundId,
)


def _fleet(tmp_path: Path, n: int, *, psk: bool = True, name: str = "f") -> list[Path]:
    fleet_dir = tmp_path / name
    init_fleet(fleet_dir, psk=psk)
    dirs = []
    for i in range(n):
        d = tmp_path / f"{name}-node{i}"
        add_node(fleet_dir, d, name=f"n{i}")
        dirs.append(d)
    return dirs


def _config() -> NodeConfig:
    # A service type of its own: tests running at once never see each other.
    return NodeConfig(service_type=f"_t{uuid.uuid4().hex[:10]}._tcp.local.")


async def _until_members(nodes: list[Node], n: int) -> None:
    with trio.fail_after(20):
        while any(len(node.members()) < n for node in nodes):
            await trio.sleep(0.05)


async def _collect(sub_iter: object, count: int, out: list[Delivery]) -> None:
    async for d in sub_iter:  # type: ignore[attr-defined]
        out.append(d)
        if len(out) == count:
            return


@pytest.mark.parametrize("psk", [True, False])
def test_three_nodes_discover_subscribe_and_deliver_in_causal_order(
    tmp_path: Path, psk: bool
) -> None:
    dirs = _fleet(tmp_path, 3, psk=psk)
    cfg = _config()
    got: dict[int, list[Delivery]] = {}
    trace: list[TraceEvent] = []
    index: dict[int, int] = {}

    def hook(i: int) -> TraceHook:
        def record(event: str, topic: str, source: int | None, seq: int | None, inc: int) -> None:
            src = index[source] if source is not None else None
            trace.append(TraceEvent(trio.current_time(), i, event, topic, src, seq))

        return record

    async def main() -> None:
        async with (
            open_node(dirs[0], cfg, trace=hook(0)) as a,
            open_node(dirs[1], cfg, trace=hook(1)) as b,
            open_node(dirs[2], cfg, trace=hook(2)) as c,
        ):
            nodes = [a, b, c]
            index.update({n.id: i for i, n in enumerate(nodes)})
            await _until_members(nodes, 3)
            with trio.fail_after(30):
                subs = [await node.subscribe("room") for node in nodes]
                async with trio.open_nursery() as nursery:
                    for node, sub in zip(nodes, subs, strict=True):
                        got[node.id] = []
                        nursery.start_soon(_collect, sub, 16, got[node.id])
                    for i in range(5):
                        for node in nodes:  # replies: each round follows the previous
                            await node.publish("room", f"{node.id:x}:{i}".encode())
                    await a.publish("room", b"last", wait_acked=True)

    trio.run(main)
    payloads = [sorted(d.payload for d in ds) for ds in got.values()]
    assert len(payloads) == 3
    assert len(payloads[0]) == 16
    assert payloads[0] == payloads[1] == payloads[2]  # agreement, exactly once
    assert not check_trace(trace, quiescent=True), format_violations(check_trace(trace))


def test_node_of_another_fleet_is_refused(tmp_path: Path) -> None:
    ours = _fleet(tmp_path, 1, name="ours")
    theirs = _fleet(tmp_path, 1, name="theirs")
    cfg = NodeConfig(discovery=False)

    async def main() -> None:
        async with open_node(ours[0], cfg) as a, open_node(theirs[0], cfg) as intruder:
            # The intruder learns our address somehow and dials: the handshake fails.
            target = Peer(a.id, "127.0.0.1", a.port, b"")
            with pytest.raises((SecurityError, EOFError)):
                await intruder.dial(target)
            with trio.fail_after(5):
                while a.stats["rejected_connections"] == 0:
                    await trio.sleep(0.02)
            # A forged discovery record never becomes a member.
            identity, fleet = load_node(theirs[0])
            forged = sign_record(identity, {"host": "127.0.0.1", "port": intruder.port}, fleet)
            with pytest.raises(SecurityError):
                a.verify(forged)
            assert a.members() == {a.id}

    trio.run(main)


def test_chat_demo_runs_and_checks_itself() -> None:
    """The README's first quick-start command (what `make demo` runs)."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "edge_examples.chat", "--demo", "--nodes", "4", "--messages", "3"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "causal order / FIFO / exactly-once: no violations" in proc.stdout
    assert "deliveries per node: [12, 12, 12, 12]" in proc.stdout


def test_an_unread_subscription_drops_with_a_count_and_a_line_not_a_flood(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each dropped delivery logged an error line: a stalled reader under load
    wrote tens of thousands a second.  Now one line per topic per interval,
    with the running count, and every drop is still counted."""
    (d,) = _fleet(tmp_path, 1)

    async def main() -> int:
        config = dataclasses.replace(_config(), discovery=False, delivery_buffer=4)
        async with open_node(d, config) as node:
            sub = await node.subscribe("t")
            await node.publish_many("t", [b"x"] * 200)  # own deliveries, never read
            return sub.dropped

    with caplog.at_level(logging.ERROR, logger="p2p.node"):
        dropped = trio.run(main)
    assert dropped == 196
    lines = [r.getMessage() for r in caplog.records if "not being read" in r.getMessage()]
    # one line, at the first publish step's drops (its PUBLISH_BATCH less the
    # queue's 4); the rest are counted only
    first = PUBLISH_BATCH - 4
    assert lines == [f"subscription 't' is not being read: deliveries dropped ({first} in all)"]


def test_outbox_batches_fit_the_frame_and_keep_order() -> None:
    """Queued packets leave in order, each frame within ``max_frame``; a packet that
    can never fit is dropped and counted, not silently lost."""

    node = Node(
        NodeIdentity.generate(), Fleet("psk", "t", psk=bytes(32)), NodeConfig(max_frame=600)
    )
    link = _Link(node, 1)

    def pub(n: int, size: int) -> PubRound:
        msg = PubMessage(MsgId(7, 0, n), b"x" * size)
        return PubRound(RoundId(7, 0, n), "t", (msg,), ())

    queued = [pub(i, 90) for i in range(12)]
    link.put([*queued[:5], pub(99, 2000), *queued[5:]])
    sent = []
    while link.outbox:
        taken = link._take()
        if taken is None:
            continue
        count, body = taken
        assert len(body) <= 600 - 64
        packets = decode_packets(body, WireLimits())
        assert len(packets) == count
        sent.extend(packets)
    assert sent == queued
    assert node.stats["oversize_dropped"] == 1


def test_outbox_sends_at_most_one_exchange_per_frame() -> None:

    node = Node(NodeIdentity.generate(), Fleet("psk", "t", psk=bytes(32)), NodeConfig())
    link = _Link(node, 1)
    pub = PubRound(RoundId(7, 0, 1), "t", (PubMessage(MsgId(7, 0, 1), b"x"),), ())
    link.put([pub])
    link.put_exchange([b"r%d" % i for i in range(600)], reply=True)
    link.put([pub])
    frames = []
    while link.outbox:
        taken = link._take()
        assert taken is not None
        frames.append(decode_frame(taken[1], WireLimits()))
    exchanges = [ex for _, ex in frames if ex is not None]
    assert [len(ex.records) for ex in exchanges] == [256, 256, 88]
    assert [ex.reply for ex in exchanges] == [False, False, True]  # only the last asks
    assert sum(len(p) for p, _ in frames) == 2


async def _until(predicate: Callable[[], bool], what: str, timeout: float = 20) -> None:
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(0.02)
    assert predicate(), f"timed out waiting until {what}"


def test_static_seeds_spread_membership_without_mdns(tmp_path: Path) -> None:
    """No multicast: every node names node 0 as its seed (node 2 also names node 1);
    all learn all members by peer exchange, then publish and deliver."""
    dirs = _fleet(tmp_path, 5, psk=False)

    async def main() -> None:
        async with open_node(dirs[0], NodeConfig(discovery=False)) as seed:
            seeds = (f"127.0.0.1:{seed.port}",)
            async with AsyncExitStack() as stack:
                nodes = [seed]
                for i, d in enumerate(dirs[1:], start=1):
                    extra = (f"127.0.0.1:{nodes[1].port}",) if i == 2 else ()
                    cfg = NodeConfig(discovery=False, seeds=seeds + extra)
                    nodes.append(await stack.enter_async_context(open_node(d, cfg)))
                ids = {n.id for n in nodes}
                await _until(lambda: all(n.members() == ids for n in nodes), "all know all")
                assert sum(n.stats["records_learned"] for n in nodes) >= 4 * 4
                subs = [await n.subscribe("t") for n in nodes]
                await nodes[3].publish("t", b"hello", wait_acked=True)
                for sub in subs:
                    with trio.fail_after(10):
                        got = await sub.receive()
                    assert (got.source, got.payload) == (nodes[3].id, b"hello")

    trio.run(main)


def test_peer_exchange_with_a_forged_record_closes_the_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ours = _fleet(tmp_path, 2, name="ours")
    theirs = _fleet(tmp_path, 1, name="theirs")
    identity, fleet = load_node(theirs[0])
    forged = sign_record(identity, {"host": "127.0.0.1", "port": 9}, fleet)

    async def main() -> None:
        cfg = NodeConfig(discovery=False)
        async with open_node(ours[0], cfg) as a, open_node(ours[1], cfg) as b:
            stream, session = await b.dial_address("127.0.0.1", a.port)
            body = encode_packets([], PeerExchange((b.record, forged), reply=True))
            await stream.send_all(frame(session.seal(body)))
            await _until(lambda: a.stats["rejected_connections"] == 1, "the exchange is refused")
            await stream.aclose()
            assert identity.node_id not in a.members()
            assert b.id in a.members()  # records before the forged one were verified and kept

    with caplog.at_level(logging.WARNING, logger="p2p.node"):
        trio.run(main)
    assert any("closing connection from" in r.getMessage() for r in caplog.records)


def test_node_config_rejects_bad_settings() -> None:
    with pytest.raises(NodeError, match="HOST:PORT"):
        NodeConfig(seeds=("localhost",))
    with pytest.raises(NodeError, match="HOST:PORT"):
        NodeConfig(seeds=("h:70000",))
    with pytest.raises(NodeError, match="interface"):
        NodeConfig(interface="0.0.0.0")
    with pytest.raises(NodeError, match="outbox_limit"):
        NodeConfig(outbox_limit=0)
    assert parse_address("[::1]:80") == ("::1", 80)
    # NaN passed every "< 0" check (and became a trio deadline); floats and
    # negative sizes were accepted where counts are needed.
    nan = float("nan")
    for name, bad in (("max_frame", -1), ("max_frame", nan), ("delivery_buffer", 2.5),
                      ("max_connections", nan), ("telemetry_max_bytes", float("inf"))):  # fmt: skip
        with pytest.raises(NodeError, match=f"{name} must be a positive int"):
            NodeConfig(**cast(dict[str, Any], {name: bad}))
    with pytest.raises(NodeError, match="port must be an int"):
        NodeConfig(port=cast(int, 1.5))
    with pytest.raises(NodeError, match="max_frame must be at most"):
        NodeConfig(max_frame=1 << 30)
    for name in ("drain_timeout", "handshake_timeout", "max_backoff", "seed_interval"):
        for value in (nan, float("inf"), -1.0):
            with pytest.raises(NodeError, match=f"{name} must be a finite positive number"):
                NodeConfig(**cast(dict[str, Any], {name: value}))


def test_gc_young_is_raised_never_lowered() -> None:
    """``NodeConfig.gc_young``: a positive int or None; the node raises the young
    threshold to it when it starts, never lowers an application's, None leaves it."""
    for bad in (0, -5, 2.5, True):
        with pytest.raises(NodeError, match="gc_young must be a positive int or None"):
            NodeConfig(gc_young=cast(int, bad))
    assert NodeConfig().gc_young == 10_000
    saved = gc.get_threshold()
    try:
        for before, young, after in ((700, 10_000, 10_000), (50_000, 10_000, 50_000),
                                     (700, None, 700)):  # fmt: skip
            gc.set_threshold(before, *saved[1:])
            _settle_heap(young)
            assert gc.get_threshold() == (after, *saved[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


@pytest.mark.parametrize("policy", ["drop", "backpressure"])
def test_slow_peer_policy(tmp_path: Path, policy: str) -> None:
    """A peer whose outbox is over half full: ``drop`` keeps publishing (and counts what
    the limit refuses), ``backpressure`` makes ``publish`` wait until the outbox drains."""
    (d,) = _fleet(tmp_path, 1)
    cfg = NodeConfig(discovery=False, outbox_limit=10, overflow=policy)
    pub = PubRound(RoundId(7, 0, 1), "t", (PubMessage(MsgId(7, 0, 1), b"x"),), ())

    async def main() -> None:
        async with open_node(d, cfg) as node:
            await node.subscribe("t")
            stuck = node._link(12345)  # a peer with no address yet: nothing leaves
            stuck.put([pub] * 14)
            assert len(stuck.outbox) == 10
            assert node.stats["outbox_overflow"] == 4
            with trio.move_on_after(0.3) as scope:
                await node.publish("t", b"hello")
            assert scope.cancelled_caught == (policy == "backpressure")
            if policy == "backpressure":
                stuck.outbox.clear()  # the peer caught up
                node._room.set()
                with trio.fail_after(5):
                    await node.publish("t", b"hello")

    trio.run(main)


def test_publish_refuses_a_non_bytes_payload(tmp_path: Path) -> None:
    (d,) = _fleet(tmp_path, 1)

    async def main() -> None:
        async with open_node(d, NodeConfig(discovery=False)) as node:
            await node.subscribe("t")
            with pytest.raises(TypeError, match="bytes"):
                await node.publish("t", "text")  # type: ignore[arg-type]

    trio.run(main)


def test_fast_delivery_constructor_builds_the_same_frozen_delivery() -> None:
    args = ("t", 1 << 63, 2, 3, b"payload", True, 1.5, 7)
    fast, slow = _new_delivery(*args), Delivery(*args)
    assert type(fast) is Delivery
    assert fast == slow
    assert hash(fast) == hash(slow)
    assert repr(fast) == repr(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.seq = 4  # type: ignore[misc]


def _delivery(seq: int) -> Delivery:
    return Delivery("t", 1, 0, seq, b"", False)


def test_subscription_queue() -> None:
    """Bounded; a reader waits for the next delivery, then takes what is queued in order
    with a schedule point every DELIVERY_BATCH; after the end, what was queued before it."""
    count = DELIVERY_BATCH * 3

    class Steps(trio.abc.Instrument):
        def __init__(self) -> None:
            self.reader: trio.lowlevel.Task | None = None
            self.steps = 0

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            self.steps += task is self.reader

    steps = Steps()

    async def main() -> None:
        sub = Subscription("t", capacity=count)
        got: list[int] = []

        async def read() -> None:
            steps.reader = trio.lowlevel.current_task()
            async for d in sub:
                got.append(d.seq)

        trio.lowlevel.add_instrument(steps)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert sub._put(_delivery(0))  # wakes the waiting reader
            await trio.testing.wait_all_tasks_blocked()
            assert got == [0]
            before = steps.steps
            for i in range(1, count + 1):
                assert sub._put(_delivery(i))
            assert not sub._put(_delivery(-1))  # full: the node counts it as dropped
            await trio.testing.wait_all_tasks_blocked()
            assert got == list(range(count + 1))
            assert steps.steps - before <= count // DELIVERY_BATCH + 2  # not one per delivery
            sub._put(_delivery(count + 1))
            sub._close()
        assert got == list(range(count + 2))  # the end came after everything queued
        with pytest.raises(trio.EndOfChannel):
            await sub.receive()

    trio.run(main)


def test_subscription_receive_is_a_cancellation_point() -> None:
    async def main() -> None:
        sub = Subscription("t", capacity=10)
        sub._put(_delivery(1))
        with trio.CancelScope() as scope:
            scope.cancel()
            await sub.receive()
        assert scope.cancelled_caught
        assert (await sub.receive()).seq == 1  # still there

    trio.run(main)


def test_batches_hand_out_what_iteration_would_in_the_same_order() -> None:
    """``receive_batch`` takes what is queued, at most ``limit``, at least one
    (waiting for it); ``batches`` ends after the last one once unsubscribed."""

    async def main() -> None:
        sub = Subscription("t", capacity=100)
        with pytest.raises(ValueError, match="at least 1"):
            sub.batches(0)
        got: list[list[int]] = []

        async def read() -> None:
            async for batch in sub.batches(limit=4):
                got.append([d.seq for d in batch])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # waits for the first
            for i in range(10):
                sub._put(_delivery(i))
            await trio.testing.wait_all_tasks_blocked()
            sub._put(_delivery(10))
            sub._close()
        assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10]]
        with pytest.raises(trio.EndOfChannel):
            await sub.receive_batch()

    trio.run(main)


def test_a_subscription_without_own_publications_gets_only_the_others(tmp_path: Path) -> None:
    """``subscribe(topic, own=False)``: this node's publications still go out
    and still order what it delivers, but are not handed out here."""
    dirs = _fleet(tmp_path, 2)
    cfg = _config()

    async def main() -> None:
        async with open_node(dirs[0], cfg) as a, open_node(dirs[1], cfg) as b:
            await _until_members([a, b], 2)
            with trio.fail_after(30):
                mine = await a.subscribe("t", own=False)
                theirs = await b.subscribe("t")
                await a.publish("t", b"a1", wait_acked=True)
                await b.publish("t", b"b1", wait_acked=True)
                await a.publish("t", b"a2", wait_acked=True)
                got_b: list[Delivery] = []
                await _collect(theirs, 3, got_b)
                assert [(d.payload, d.own) for d in got_b] == [
                    (b"a1", False),
                    (b"b1", True),
                    (b"a2", False),
                ]
                await a.unsubscribe("t")
                assert [d.payload async for d in mine] == [b"b1"]

    trio.run(main)


def test_unsubscribe_ends_the_iteration(tmp_path: Path) -> None:
    (d,) = _fleet(tmp_path, 1)

    async def main() -> None:
        async with open_node(d, NodeConfig(discovery=False)) as node:
            sub = await node.subscribe("t")
            await node.publish("t", b"a")
            await node.publish("t", b"b")
            await node.unsubscribe("t")
            with trio.fail_after(5):
                assert [x.payload async for x in sub] == [b"a", b"b"]

    trio.run(main)


def test_telemetry_counts_only_deliveries_that_were_held_back(tmp_path: Path) -> None:
    """One publisher, rounds in FIFO order over one TCP connection: every
    publication is delivered in the batch it arrived in, so none is counted
    as held back (earlier every delivery was, by a clock read per output)."""
    dirs = _fleet(tmp_path, 2, psk=False)
    spool = tmp_path / "spool"

    async def main() -> None:
        async with open_node(dirs[0], NodeConfig(discovery=False)) as pub:
            cfg = NodeConfig(discovery=False, seeds=(f"127.0.0.1:{pub.port}",),
                             telemetry_dir=spool)  # fmt: skip
            async with open_node(dirs[1], cfg) as sub:
                await _until(lambda: pub.members() == sub.members(), "both know both")
                await pub.subscribe("t")
                subscription = await sub.subscribe("t")
                await _until(lambda: sub.id in pub.core.view("t"), "pub sees the subscriber")
                for k in range(20):
                    await pub.publish("t", b"%d" % k, wait_acked=True)
                got: list[Delivery] = []
                with trio.fail_after(10):
                    await _collect(subscription, 20, got)

    trio.run(main)
    topics = [r for r in read_records(sorted(spool.rglob("*.cbor"))) if r["kind"] == "topic"]
    assert sum(r["deliveries"] for r in topics) == 20
    assert sum(r["held"] for r in topics) == 0


def test_telemetry_times_hold_back_from_the_batch_a_publication_arrived_in(
    tmp_path: Path,
) -> None:
    """The node keeps an arrival time only for a publication not delivered in
    its own batch; delivered in a later batch, its hold-back is the time between
    the two batches, and nothing stays behind (core outputs fed by hand)."""
    (node_dir,) = _fleet(tmp_path, 1)
    spool = tmp_path / "spool"
    # Three sources: the frontier lets through each source's ordinals in order only.
    a, b, c = (MsgId(source, 0, 1) for source in (7, 8, 9))

    def out(mid: MsgId, stamp: float) -> Delivered:
        return Delivered("t", mid, bytes(ENVELOPE_SIZE) + _STAMP.pack(stamp) + b"x")

    async def main() -> None:
        async with open_node(node_dir, NodeConfig(discovery=False, telemetry_dir=spool)) as node:
            await node.subscribe("t")
            t0, wall = trio.current_time(), time.time()
            node._handle([Received("t", a, False), Received("t", b, False), out(b, wall),
                          Received("t", c, False)], t0)  # fmt: skip
            assert set(node._received_at) == {a, c}  # b went in its own batch
            node._handle([out(c, wall), out(a, wall)], t0 + 0.25)
            assert not node._received_at
            assert node._arrived is None

    trio.run(main)
    (topic,) = [r for r in read_records(sorted(spool.rglob("*.cbor"))) if r["kind"] == "topic"]
    assert (topic["deliveries"], topic["held"]) == (3, 2)
    assert topic["holdback"][bucket(250.0)] == 2
    assert sum(topic["latency"][: bucket(250.0) + 1]) == 3  # stamps are a wall-clock moment old


def _chain(short: int | None) -> tuple[PubMessage, ...]:
    """Five publications of source 7, each naming the one before; ``short``: the
    one whose payload lacks the stamp (no honest member sends that)."""
    stamp = time.time()
    msgs, before = [], None
    for k in range(5):
        mid = MsgId(7, 0, k)
        payload = bytes(ENVELOPE_SIZE) + _STAMP.pack(stamp + k) + b"p%d" % k
        if k == short:
            payload = bytes(ENVELOPE_SIZE)
        msgs.append(PubMessage(mid, payload, (before,) if before else (), (), k - 1))
        before = mid
    return tuple(msgs)


def _handed(
    node_dir: Path, outputs: list[Any], *, traced: bool, capacity: int, own: bool = True
) -> tuple[list[Delivery], tuple[int, int], list[tuple[object, ...]]]:
    """What a node subscribed to ``t`` hands its reader for ``outputs`` (core
    outputs fed by hand): the deliveries, (dropped, malformed), the trace."""
    trace: list[tuple[object, ...]] = []
    hook = (lambda *event: trace.append(event)) if traced else None
    got: list[Delivery] = []
    counts: list[tuple[int, int]] = []

    async def main() -> None:
        cfg = NodeConfig(discovery=False, delivery_buffer=capacity)
        async with open_node(node_dir, cfg, trace=hook) as node:
            sub = await node.subscribe("t", own=own)
            node._handle(outputs)
            got.extend(sub._queue)
            counts.append((sub.dropped, node.stats["malformed_payload"]))

    trio.run(main)
    return got, counts[0], [e for e in trace if e[0] in ("deliver", "publish")]


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("capacity", [100, 3])
@pytest.mark.parametrize("short", [None, 1])
def test_a_run_reaches_the_reader_as_its_deliveries_one_by_one(
    tmp_path: Path, traced: bool, capacity: int, short: int | None
) -> None:
    """A ``DeliveredRun`` hands out what its expansion does, one by one: the
    same deliveries, the same drops when the queue is full, the same trace,
    the same count of payloads without the envelope and stamp."""
    (node_dir,) = _fleet(tmp_path, 1)
    run = DeliveredRun("t", _chain(short))
    got = _handed(node_dir, [run], traced=traced, capacity=capacity)
    assert got == _handed(node_dir, list(run.expand()), traced=traced, capacity=capacity)
    assert len(got[0]) == min(capacity, 5 - (short is not None))


@pytest.mark.parametrize("own", [True, False])
@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("capacity", [100, 3])
@pytest.mark.parametrize("short", [None, 1])
def test_an_own_run_reaches_the_reader_as_its_deliveries_one_by_one(
    tmp_path: Path, own: bool, traced: bool, capacity: int, short: int | None
) -> None:
    """A ``PublishedRun`` (this node's ``publish_many``) hands an ``own``
    subscription what its expansion does, one by one: the same deliveries,
    drops, trace and count of payloads without the envelope."""
    (node_dir,) = _fleet(tmp_path, 1)
    run = PublishedRun("t", _chain(short))
    got = _handed(node_dir, [run], traced=traced, capacity=capacity, own=own)
    assert got == _handed(node_dir, list(run.expand()), traced=traced, capacity=capacity, own=own)
    assert len(got[0]) == (min(capacity, 5 - (short is not None)) if own else 0)
    assert all(d.own for d in got[0])


def test_a_seed_naming_the_node_itself_is_skipped() -> None:
    from p2p.runtime._node import _names_self

    assert _names_self("127.0.0.1:4000", "127.0.0.1", 4000)
    assert _names_self("127.0.0.1:4000", "0.0.0.0", 4000)
    assert not _names_self("127.0.0.1:4001", "127.0.0.1", 4000)
    assert not _names_self("10.0.0.2:4000", "10.0.0.1", 4000)
    assert not _names_self("10.0.0.2:4000", "0.0.0.0", 4000)

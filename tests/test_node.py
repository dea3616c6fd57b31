"""Real nodes on loopback: TCP, the fleet's secure channel and mDNS discovery."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import trio

from p2p._discovery import Peer
from p2p._errors import SecurityError
from p2p._identity import add_node, init_fleet, load_node
from p2p._node import Delivery, Node, NodeConfig, TraceHook, open_node
from p2p.sim import TraceEvent, check_trace, format_violations


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
        def record(event: str, topic: str, source: int | None, seq: int | None) -> None:
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
            from p2p._secure import sign_record

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


def test_outbox_batches_fit_the_frame_and_keep_order() -> None:
    """Queued packets leave in order, each frame within ``max_frame``; a packet that
    can never fit is dropped and counted, not silently lost."""
    from causal import MsgId
    from p2p._identity import Fleet, NodeIdentity
    from p2p._node import _Link
    from p2p._wire import WireLimits, decode_packets
    from topics import PubMessage, PubRound, RoundId

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
        batch, body = taken
        assert len(body) <= 600 - 64
        assert decode_packets(body, WireLimits()) == batch
        sent.extend(batch)
    assert sent == queued
    assert node.stats["oversize_dropped"] == 1

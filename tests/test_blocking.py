"""The blocking facade: a plain script drives real nodes without touching trio."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from p2p import BlockingNode, NodeConfig, NodeError, open_node
from p2p._identity import add_node, init_fleet
from topics import NotSubscribedError


def _dirs(tmp_path: Path, n: int) -> list[Path]:
    init_fleet(tmp_path / "fleet", psk=True)
    dirs = [tmp_path / f"n{i}" for i in range(n)]
    for d in dirs:
        add_node(tmp_path / "fleet", d)
    return dirs


def test_two_plain_script_nodes_publish_and_receive(tmp_path: Path) -> None:
    a_dir, b_dir = _dirs(tmp_path, 2)
    with BlockingNode(a_dir, NodeConfig(discovery=False)) as a:
        cfg = NodeConfig(discovery=False, seeds=(f"127.0.0.1:{a.port}",))
        with BlockingNode(b_dir, cfg) as b:
            assert b.wait_for_members(2, timeout=20) == {a.id, b.id}
            a.wait_for_members(2, timeout=20)
            sub_a = a.subscribe("sensors", timeout=20)
            sub_b = b.subscribe("sensors", timeout=20)
            for i in range(5):
                b.publish("sensors", f"reading {i}", wait_acked=i == 4, timeout=20)
            got = [sub_a.get(timeout=5) for _ in range(5)]
            assert [d.payload for d in got if d] == [f"reading {i}".encode() for i in range(5)]
            own = sub_b.get(timeout=5)
            assert own is not None
            assert (own.source, own.own, own.payload) == (b.id, True, b"reading 0")
            assert b.stats["packets_sent"] > 0
            assert threading.current_thread() is threading.main_thread()


def test_timeouts_misuse_and_close_are_clear_errors(tmp_path: Path) -> None:
    (d,) = _dirs(tmp_path, 1)
    node = BlockingNode(d, NodeConfig(discovery=False))
    sub = node.subscribe("t", timeout=10)
    with pytest.raises(TimeoutError, match=r"no delivery on 't' after 0\.1 s"):
        sub.get(timeout=0.1)
    with pytest.raises(TimeoutError, match=r"1 of 2 members known after 0\.1 s"):
        node.wait_for_members(2, timeout=0.1)
    with pytest.raises(NodeError, match="timeout must be a non-negative number"):
        sub.get(timeout=-1)
    with pytest.raises(NodeError, match="count of at least 1"):
        node.wait_for_members(0)
    with pytest.raises(NotSubscribedError):
        node.publish("other", b"x")
    sub.unsubscribe()
    assert sub.get(timeout=1) is None  # the subscription ended
    assert list(sub) == []
    node.close()
    with pytest.raises(NodeError, match="closed"):
        node.publish("t", b"x")
    with pytest.raises(NodeError, match="closed"):
        node.members()
    node.close()  # idempotent


def test_a_node_that_cannot_start_raises(tmp_path: Path) -> None:
    with pytest.raises(NodeError, match="could not start"):
        BlockingNode(tmp_path / "missing", NodeConfig(discovery=False))


def test_the_payload_limit_is_exactly_the_documented_one(tmp_path: Path) -> None:
    a_dir, b_dir = _dirs(tmp_path, 2)
    limit = NodeConfig().pubsub.max_payload
    assert limit == 64 * 1024  # docs/runtime.md, "Limits": payload 64 KiB
    with BlockingNode(a_dir, NodeConfig(discovery=False)) as a:
        cfg = NodeConfig(discovery=False, seeds=(f"127.0.0.1:{a.port}",))
        with BlockingNode(b_dir, cfg) as b:
            b.wait_for_members(2, timeout=20)
            a.wait_for_members(2, timeout=20)
            sub_a = a.subscribe("big", timeout=20)
            b.subscribe("big", timeout=20)
            b.publish("big", b"x" * limit, wait_acked=True, timeout=20)
            got = sub_a.get(timeout=10)
            assert got is not None
            assert got.payload == b"x" * limit
            with pytest.raises(NodeError, match=f"{limit + 1} bytes exceeds the limit of {limit}"):
                b.publish("big", b"x" * (limit + 1))


@pytest.mark.parametrize(
    ("interface", "reason"),
    [("192.0.2.1", "Cannot assign requested address"), ("not an address", "not known")],
)
def test_a_node_that_cannot_listen_says_where_and_why(
    tmp_path: Path, interface: str, reason: str
) -> None:
    """It said "Exceptions from Trio nursery (1 sub-exception)"; the async API
    raised that group itself."""
    (d,) = _dirs(tmp_path, 1)
    config = NodeConfig(interface=interface, discovery=False)
    with pytest.raises(NodeError, match=f"cannot listen on {interface} port 0: .*{reason}"):
        BlockingNode(d, config)

    async def main() -> None:
        async with open_node(d, config):
            raise AssertionError("the node opened")

    with pytest.raises(NodeError, match=f"cannot listen on {interface}"):
        trio.run(main)

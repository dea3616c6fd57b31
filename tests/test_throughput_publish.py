"""The publish path of issue 22: ``publish_many``, the schedule points of ``publish``,
and the private key read without cryptography's serialization module."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from p2p._errors import IdentityError
from p2p._identity import _ed25519_pem_seed, _load_private_key, _pem, add_node, init_fleet
from p2p.runtime import Delivery, NodeConfig, NodeError, open_node
from p2p.runtime._node import PUBLISH_BATCH
from topics import NotSubscribedError


def _nodes(tmp_path: Path, n: int) -> list[Path]:
    init_fleet(tmp_path / "fleet", psk=True)
    dirs = [tmp_path / f"node{i}" for i in range(n)]
    for i, d in enumerate(dirs):
        add_node(tmp_path / "fleet", d, name=f"n{i}")
    return dirs


async def _until_members(nodes: list[object], n: int) -> None:
    with trio.fail_after(20):
        while any(len(node.members()) < n for node in nodes):  # type: ignore[attr-defined]
            await trio.sleep(0.02)


def test_publish_many_delivers_every_payload_in_order_with_its_ids(tmp_path: Path) -> None:
    """Two nodes: what one publishes with ``publish_many`` (more than a batch) reaches the
    other in order, with the ids it returned, and the publisher delivers its own."""
    a_dir, b_dir = _nodes(tmp_path, 2)
    payloads = [b"m%d" % i for i in range(3 * PUBLISH_BATCH + 5)]

    async def main() -> None:
        async with open_node(a_dir, NodeConfig(discovery=False)) as a:
            seeds = (f"127.0.0.1:{a.port}",)
            async with open_node(b_dir, NodeConfig(discovery=False, seeds=seeds)) as b:
                await _until_members([a, b], 2)
                sub_a = await a.subscribe("t")
                sub_b = await b.subscribe("t")
                ids = await a.publish_many("t", payloads)
                first = ids[0].seq
                assert [i.seq for i in ids] == list(range(first, first + len(payloads)))
                assert len({(i.source, i.incarnation) for i in ids}) == 1
                for sub, own in ((sub_b, False), (sub_a, True)):
                    got: list[Delivery] = []
                    with trio.fail_after(20):
                        while len(got) < len(payloads):
                            got.append(await sub.receive())
                    assert [d.payload for d in got] == payloads
                    assert [(d.source, d.incarnation, d.seq) for d in got] == [
                        tuple(i) for i in ids
                    ]
                    assert all(d.own is own for d in got)
                    assert all(d.published_at > 0 for d in got)

    trio.run(main)


def test_publish_many_checks_every_payload_before_publishing_any(tmp_path: Path) -> None:
    (d,) = _nodes(tmp_path, 1)

    async def main() -> None:
        async with open_node(d, NodeConfig(discovery=False)) as node:
            sub = await node.subscribe("t")
            with pytest.raises(TypeError, match="bytes"):
                await node.publish_many("t", [b"ok", "text"])  # type: ignore[list-item]
            too_big = bytes(node.config.pubsub.max_payload + 1)
            with pytest.raises(NodeError, match="max_payload"):
                await node.publish_many("t", [b"ok", too_big])
            with pytest.raises(NotSubscribedError):
                await node.publish_many("other", [b"x"])
            assert await node.publish_many("t", []) == []
            (mid,) = await node.publish_many("t", [b"after"])
            with trio.fail_after(5):
                got = await sub.receive()
            assert (got.seq, got.payload) == (mid.seq, b"after")  # nothing before it

    trio.run(main)


@pytest.mark.parametrize("many", [False, True])
def test_a_loop_of_publications_lets_other_tasks_run(tmp_path: Path, many: bool) -> None:
    """``publish`` is a schedule point every ``PUBLISH_BATCH`` calls (and
    ``publish_many`` between batches): a publisher looping flat out does not hold
    the node's other tasks, such as the link writers, for its whole loop."""
    (d,) = _nodes(tmp_path, 1)

    async def main() -> None:
        async with open_node(d, NodeConfig(discovery=False)) as node:
            await node.subscribe("t")
            ran = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_set, ran)  # runs once this task lets others run
                # Two schedule points: trio may run this task first in the batch
                # after the first one, but _set runs before the second ends.
                count = 2 * PUBLISH_BATCH + 1
                if many:
                    await node.publish_many("t", [b"x"] * count)
                else:
                    for _ in range(count):
                        await node.publish("t", b"x")
                assert ran.is_set()

    trio.run(main)


async def _set(event: trio.Event) -> None:
    event.set()


def test_a_private_key_reads_back_without_the_serialization_module(tmp_path: Path) -> None:
    """The PEM files the library writes are read by the direct parser (same key);
    anything else goes to cryptography's, which still names what is wrong."""
    for _ in range(20):
        key = Ed25519PrivateKey.generate()
        pem = _pem(key)
        fast = _ed25519_pem_seed(pem)
        assert fast is not None
        assert fast.private_bytes_raw() == key.private_bytes_raw()
        path = tmp_path / "key.pem"
        path.write_bytes(pem)
        path.chmod(0o600)  # the loader refuses a key others can read
        assert _load_private_key(path).private_bytes_raw() == key.private_bytes_raw()
    crlf = pem.replace(b"\n", b"\r\n")  # another layout: cryptography's parser reads it
    assert _ed25519_pem_seed(crlf) is None
    path.write_bytes(crlf)
    assert _load_private_key(path).private_bytes_raw() == key.private_bytes_raw()
    broken = pem.replace(b"MC4C", b"MC4D")
    assert _ed25519_pem_seed(broken) is None
    path.write_bytes(broken)
    with pytest.raises(IdentityError, match="corrupt"):
        _load_private_key(path)

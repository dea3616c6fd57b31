"""Real mDNS on loopback: two announcers find each other; unverifiable records are ignored."""

from __future__ import annotations

import json

import pytest
import trio

from p2p._membership import Peer
from p2p.runtime._discovery import Discovery, DiscoveryError, PeerEvent, chunk_record, join_record


def _record(node_id: int, port: int, *, good: bool = True) -> bytes:
    return json.dumps({"id": node_id, "port": port, "good": good}).encode()


def _verify(data: bytes) -> Peer:
    doc = json.loads(data)
    if not doc["good"]:
        raise DiscoveryError("bad signature (test stand-in)")
    return Peer(doc["id"], "127.0.0.1", doc["port"], data)


def _announcer(node_id: int, port: int, *, good: bool = True) -> Discovery:
    return Discovery(
        interface="127.0.0.1",
        node_id=node_id,
        port=port,
        record=_record(node_id, port, good=good),
        verify=_verify,
        service_type="_vcubeps-test._tcp.local.",
    )


def test_record_chunks_round_trip() -> None:
    record = bytes(range(256)) * 3
    props: dict[bytes, bytes | None] = dict(chunk_record(record))
    assert all(len(v or b"") <= 200 for v in props.values())
    assert join_record(props) == record


async def _first_up(d: Discovery) -> list[PeerEvent]:
    seen: list[PeerEvent] = []
    async for ev in d.events():
        seen.append(ev)
        if ev.kind == "up":
            break
    return seen


def test_two_nodes_find_each_other_and_see_a_leave() -> None:
    async def main() -> None:
        async with _announcer(0xA1, 4001) as a:
            async with _announcer(0xB2, 4002) as b:
                with trio.fail_after(15):
                    got_a = await _first_up(a)
                    got_b = await _first_up(b)
                assert got_a[-1].peer.node_id == 0xB2
                assert got_a[-1].peer.port == 4002
                assert got_b[-1].peer.node_id == 0xA1
            with trio.fail_after(15):
                async for ev in a.events():
                    if ev.kind == "down":
                        assert ev.peer.node_id == 0xB2
                        break

    trio.run(main)


def test_forged_record_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    ups: list[int] = []

    async def main() -> None:
        async with (
            _announcer(0xC3, 4003) as c,
            _announcer(0xD4, 4004, good=False),
            _announcer(0xE5, 4005),
        ):
            with trio.move_on_after(4):  # long enough to resolve both services
                async for ev in c.events():
                    ups.append(ev.peer.node_id)

    trio.run(main)
    assert ups == [0xE5]
    assert "bad signature" in caplog.text


def test_browsing_does_not_wait_for_the_announcement() -> None:
    """Entering returns before the announcements are sent (the last one 450 ms after
    the first, by zeroconf's schedule), and the peers are found."""

    async def main() -> None:
        async with _announcer(0xA6, 4006) as a, _announcer(0xB7, 4007) as b:
            assert not b.registered.is_set()
            with trio.fail_after(15):
                got_b = await _first_up(b)
                got_a = await _first_up(a)
                await a.registered.wait()
                await b.registered.wait()
            assert got_b[-1].peer.node_id == 0xA6
            assert got_a[-1].peer.node_id == 0xB7

    trio.run(main)


def test_a_squatted_name_is_announced_anyway() -> None:
    """A forger already answering for this node's name neither stops discovery
    nor keeps the node's own service from being announced."""

    async def main() -> None:
        async with (
            _announcer(0xF8, 4008, good=False),
            _announcer(0xC9, 4009),
            _announcer(0xF8, 4010) as victim,
        ):
            with trio.fail_after(15):
                got = await _first_up(victim)
                await victim.registered.wait()
            assert got[-1].peer.node_id == 0xC9

    trio.run(main)

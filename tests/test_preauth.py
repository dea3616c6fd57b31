"""What an unauthenticated peer can cost a node (issue 20, part): real processes.

A subscriber (``p2p node``) receives 400 unauthenticated TCP connections, each
announcing a 1 MiB frame and pushing 1 MiB of junk, while a publisher sends
it messages over the fleet's secure channel.  A handshake message is refused
on its length prefix, before a byte of it is buffered, and handshakes are
capped, so the subscriber's peak RSS (VmHWM) stays within 20 MB of its idle
peak and it delivers every message.  Also: the caps' arithmetic, and the
length check on the first frames of a reader.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_system_netns import Role, make_fleet

from bench._preauth import free_port, measure
from p2p._secure import MAX_HANDSHAKE_SIZE
from p2p.wire import FrameReader, WireError, WireLimits

JUNK = 400
FRAME = 1 << 20


def test_reader_refuses_a_big_handshake_frame_on_its_prefix() -> None:
    reader = FrameReader(WireLimits(max_frame=FRAME), tight=2, tight_max=MAX_HANDSHAKE_SIZE)
    assert reader.feed(b"\x00\x00\x00\x03abc") == [b"abc"]  # 1st: small enough
    with pytest.raises(WireError, match="2048"):
        reader.feed(FRAME.to_bytes(4, "big") + b"x" * 100)  # 2nd: over the handshake limit
    assert reader.buffered == 0
    after = FrameReader(WireLimits(max_frame=FRAME), tight=1, tight_max=MAX_HANDSHAKE_SIZE)
    after.feed(b"\x00\x00\x00\x01a")
    body = b"y" * 5000  # past the handshake: the data limit applies
    assert after.feed(len(body).to_bytes(4, "big") + body) == [body]


@pytest.mark.slow
def test_junk_connections_cost_a_subscriber_almost_nothing(tmp_path: Path) -> None:
    res = measure(tmp_path, junk=JUNK, frame=FRAME, messages=200)
    why = res["subscriber_stderr_tail"] + res["publisher_stderr_tail"]
    assert res["publisher_exit"] == 0, why
    assert res["delivered"] == 200, why
    assert res["grown_mb"] <= 20, f"peak RSS grew {res['grown_mb']:.1f} MB under {JUNK} junk"
    assert "Traceback" not in res["subscriber_stderr_tail"], why


def _hold(port: int, count: int) -> list[socket.socket]:
    """``count`` unauthenticated connections that send nothing, kept open."""
    held = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    return held


def _low_fd_limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.slow
def test_restarting_member_gets_in_past_junk_with_few_file_descriptors(tmp_path: Path) -> None:
    """The target runs with 256 file descriptors; 300 silent unauthenticated
    connections are open to it.  A member that restarts still gets in at once:
    the oldest handshakes under way are evicted for new connections, instead
    of holding their slot (and descriptor) for the 10 s handshake timeout."""
    nodes = make_fleet(tmp_path, [Role("t")] * 2, psk=True)
    port = free_port()
    target = subprocess.Popen(
        [sys.executable, "-m", "p2p", "sub", "--identity", str(nodes[1].identity),
         "--port", str(port), "--seed", f"127.0.0.1:{port}", "--no-mdns", "--duration", "40",
         "--settle", "0", "t"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_low_fd_limit,
    )  # fmt: skip
    held: list[socket.socket] = []
    try:
        time.sleep(4)
        held = _hold(port, 300)
        time.sleep(1)
        start = time.monotonic()
        pub = subprocess.run(
            [sys.executable, "-m", "p2p", "pub", "--identity", str(nodes[0].identity),
             "--seed", f"127.0.0.1:{port}", "--no-mdns", "--settle", "0.5", "t", "back"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        took = time.monotonic() - start
    finally:
        for s in held:
            s.close()
        target.kill()
        out, err = target.communicate(timeout=30)
    assert len(held) >= 250, f"only {len(held)} junk connections opened"
    assert pub.returncode == 0, pub.stderr
    assert out.rstrip().endswith("back"), out + err + "PUB:" + pub.stderr
    assert took < 10, f"the member took {took:.1f} s to get in (the handshake timeout is 10 s)"
    assert "Traceback" not in err, err[-3000:]


def test_a_burst_of_members_is_queued_not_refused(tmp_path: Path) -> None:
    """40 members dial a node that allows 4 handshakes at once, all together:
    the node accepts the burst, lets 4 run and keeps the rest queued in the
    listen backlog, so every handshake completes and none is refused (a
    member's dial speaks at once: it is never the silent one evicted)."""
    import trio

    from p2p._identity import add_node, init_fleet, load_node
    from p2p._transport import dial_secure
    from p2p.runtime import NodeConfig, open_node

    init_fleet(tmp_path / "f", psk=True)
    dirs = [tmp_path / f"n{i}" for i in range(41)]
    for i, d in enumerate(dirs):
        add_node(tmp_path / "f", d, name=f"n{i}")
    cfg = NodeConfig(discovery=False, max_handshakes=4, handshake_timeout=10.0)
    done: list[int] = []

    async def dial(d: Path, port: int) -> None:
        identity, fleet = load_node(d)
        stream, session, _ = await dial_secure("127.0.0.1", port, identity, fleet, 10.0)
        done.append(session.peer_id)
        await trio.sleep(1.0)  # held open: the slots free only as handshakes end
        await stream.aclose()

    async def main() -> None:
        async with open_node(dirs[0], cfg) as node:
            async with trio.open_nursery() as nursery:
                for d in dirs[1:]:
                    nursery.start_soon(dial, d, node.port)
            assert node.stats["refused_connections"] == 0, node.stats
            assert done == [node.id] * 40

    trio.run(main)

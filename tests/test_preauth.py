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
import threading
import time
from pathlib import Path

import pytest
from test_system_netns import Role, make_fleet

from p2p._secure import MAX_HANDSHAKE_SIZE
from p2p._wire import FrameReader, WireError, WireLimits

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


def _vmhwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _junk(port: int, out: list[int], hold: threading.Event) -> None:
    """One unauthenticated connection: a 1 MiB length prefix, then all but the
    last byte of 1 MiB of junk, held open (a frame that never completes)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            try:
                s.sendall(FRAME.to_bytes(4, "big") + b"\xa5" * (FRAME - 1))
                out.append(1)
            except OSError:
                out.append(0)  # reset early: the point of the exercise
            hold.wait(30)
    except OSError:
        out.append(0)  # refused


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.slow
def test_junk_connections_cost_a_subscriber_almost_nothing(tmp_path: Path) -> None:
    nodes = make_fleet(tmp_path, [Role("t")] * 2, psk=True)
    port = _free_port()
    common = ["--no-mdns", "--duration", "45", "--quiet"]
    sub = subprocess.Popen(
        [sys.executable, "-m", "p2p", "sub", "--identity", str(nodes[1].identity),
         "--port", str(port), "--seed", f"127.0.0.1:{port}", "--count", "200", *common, "t"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(6)  # started, settled, subscribed: its idle peak
        idle = _vmhwm_kb(sub.pid)
        results: list[int] = []
        hold = threading.Event()
        threads = [threading.Thread(target=_junk, args=(port, results, hold)) for _ in range(JUNK)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(results) < JUNK and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        under_attack = _vmhwm_kb(sub.pid)
        hold.set()
        for t in threads:
            t.join(30)
        pub = subprocess.run(
            [sys.executable, "-m", "p2p", "pub", "--identity", str(nodes[0].identity),
             "--seed", f"127.0.0.1:{port}", *common[:1], "t", *[f"m{i}" for i in range(200)]],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        out, err = sub.communicate(timeout=60)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert pub.returncode == 0, pub.stderr
    got = [line.rsplit(" ", 1)[-1] for line in out.splitlines()]
    assert got == [f"m{i}" for i in range(200)], out[-2000:] + err[-2000:]
    grown_mb = (under_attack - idle) / 1024
    assert len(results) == JUNK
    assert grown_mb <= 20, f"peak RSS grew {grown_mb:.1f} MB under {JUNK} junk connections"
    assert "Traceback" not in err, err[-3000:]


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
    port = _free_port()
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
    assert out.rstrip().endswith("back"), out + err
    assert took < 10, f"the member took {took:.1f} s to get in (the handshake timeout is 10 s)"
    assert "Traceback" not in err, err[-3000:]

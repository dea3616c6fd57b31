"""Pre-authentication load: what unauthenticated connections cost a node (issue 20).

A subscriber (``p2p sub``, static seed, no mDNS) starts and settles; its peak
RSS (``VmHWM``) is read; ``junk`` unauthenticated connections then each
announce a ``frame``-byte frame and push all but its last byte, and stay open;
``VmHWM`` is read again, and a publisher sends ``messages`` messages that the
subscriber must all deliver.  Used by ``python -m bench.runtime --only
preauth`` and by ``tests/test_preauth.py``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["free_port", "junk_connection", "measure", "vmhwm_kb"]


def vmhwm_kb(pid: int) -> int:
    """Peak resident set size of process ``pid``, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for pid {pid}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def junk_connection(port: int, frame: int, out: list[int], hold: threading.Event) -> None:
    """One unauthenticated connection: a ``frame``-byte length prefix, then all but
    the last byte of it, held open until ``hold`` (a frame that never completes).
    Appends 1 to ``out`` if everything was written, 0 if refused or reset early."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            try:
                s.sendall(frame.to_bytes(4, "big") + b"\xa5" * (frame - 1))
                out.append(1)
            except OSError:
                out.append(0)
            hold.wait(30)
    except OSError:
        out.append(0)


def _fleet(root: Path) -> tuple[Path, Path]:
    run = [sys.executable, "-m", "p2p", "fleet"]
    subprocess.run([*run, "init", str(root / "fleet"), "--psk"], check=True, capture_output=True)
    for name in ("pub", "sub"):
        subprocess.run(
            [*run, "add-node", str(root / "fleet"), str(root / name)],
            check=True,
            capture_output=True,
        )
    return root / "pub", root / "sub"


def measure(root: Path, *, junk: int = 400, frame: int = 1 << 20, messages: int = 200) -> Any:
    """The subscriber's idle and under-attack peak RSS (MB) and its deliveries."""
    pub_dir, sub_dir = _fleet(root)
    port = free_port()
    common = ["--no-mdns", "--quiet"]
    sub = subprocess.Popen(
        [sys.executable, "-m", "p2p", "sub", "--identity", str(sub_dir), "--port", str(port),
         "--seed", f"127.0.0.1:{port}", "--count", str(messages), "--duration", "60",
         *common, "t"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    written: list[int] = []
    hold = threading.Event()
    try:
        time.sleep(6)  # started, settled, subscribed
        idle = vmhwm_kb(sub.pid)
        threads = [
            threading.Thread(target=junk_connection, args=(port, frame, written, hold))
            for _ in range(junk)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(written) < junk and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)
        attacked = vmhwm_kb(sub.pid)
        hold.set()
        for t in threads:
            t.join(30)
        pub = subprocess.run(
            [sys.executable, "-m", "p2p", "pub", "--identity", str(pub_dir),
             "--seed", f"127.0.0.1:{port}", *common, "t", *[f"m{i}" for i in range(messages)]],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        out, err = sub.communicate(timeout=60)
    finally:
        hold.set()
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    got = [line.rsplit(" ", 1)[-1] for line in out.splitlines()]
    return {
        "junk_connections": junk,
        "junk_frame_bytes": frame,
        "junk_fully_written": sum(written),
        "idle_vmhwm_mb": idle / 1024,
        "attacked_vmhwm_mb": attacked / 1024,
        "grown_mb": (attacked - idle) / 1024,
        "messages": messages,
        "delivered": sum(g == f"m{i}" for i, g in enumerate(got)),
        "publisher_exit": pub.returncode,
        "subscriber_stderr_tail": err[-2000:],
        "publisher_stderr_tail": pub.stderr[-2000:],
    }

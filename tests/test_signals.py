"""Ctrl-C, SIGTERM and ``--duration`` end ``p2p sub`` / ``p2p node`` / ``p2p status``
with a graceful leave: real processes, and a second node that watches.

The watcher and the nodes find each other through ``--seed`` only (``--no-mdns``),
so the only way the watcher can log a node as ``left`` is the node's own LEAVE;
without it the failure detector would log a suspicion instead.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cli import P2P, free_port, in_log, make_fleet, start, stop, wait_for

VICTIMS = ["sub-int", "sub-term", "node-int", "node-term", "sub-duration", "node-duration"]


class Watcher:
    def __init__(self, root: Path, ids: dict[str, str], port: int, log: Path) -> None:
        self.root, self.ids, self.port, self.log = root, ids, port, log

    def args(self, name: str, command: str) -> list[str]:
        """``p2p COMMAND`` for member ``name``, joining through the watcher."""
        topic = ["t"] if command == "sub" else ["--subscribe", "t"]
        return [
            command, "--identity", str(self.root / name), "--no-mdns",
            "--seed", f"127.0.0.1:{self.port}", "--settle", "0", *topic,
        ]  # fmt: skip


@pytest.fixture(scope="module")
def watcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watcher]:
    root = tmp_path_factory.mktemp("signals")
    ids = make_fleet(root, ["watcher", "status", *VICTIMS], psk=True)
    port, log = free_port(), root / "watcher.log"
    proc = start(
        ["node", "--identity", str(root / "watcher"), "--port", str(port), "--no-mdns",
         "--seed", f"127.0.0.1:{port}", "--subscribe", "t", "--settle", "0"],
        log,
    )  # fmt: skip
    try:
        wait_for("the watcher", in_log(log, "subscribed to 't'"), log=log)
        yield Watcher(root, ids, port, log)
    finally:
        stop(proc)


def _joined(w: Watcher, name: str, proc: subprocess.Popen[str], log: Path) -> None:
    wait_for(f"{name} up", in_log(log, "subscribed to 't'"), log=log)
    wait_for(f"the watcher to see {name}", in_log(w.log, f"joined {w.ids[name]}"), log=w.log)
    assert proc.poll() is None


def _left_gracefully(w: Watcher, name: str) -> None:
    node = w.ids[name]
    wait_for(f"{name}'s leave", in_log(w.log, f"left {node} (left;"), timeout=20, log=w.log)
    assert f"suspect {node}" not in w.log.read_text()


@pytest.mark.parametrize(
    ("name", "signum", "code"),
    [
        ("sub-int", signal.SIGINT, 130),
        ("sub-term", signal.SIGTERM, 0),
        ("node-int", signal.SIGINT, 130),
        ("node-term", signal.SIGTERM, 0),
    ],
)
def test_a_signal_ends_with_a_graceful_leave(
    watcher: Watcher, name: str, signum: int, code: int
) -> None:
    log = watcher.root / f"{name}.log"
    proc = start(watcher.args(name, name.split("-")[0]), log)
    try:
        _joined(watcher, name, proc, log)
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == code, log.read_text()
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text()
    _left_gracefully(watcher, name)


@pytest.mark.parametrize("name", ["sub-duration", "node-duration"])
def test_the_end_of_duration_is_a_graceful_leave(watcher: Watcher, name: str) -> None:
    log = watcher.root / f"{name}.log"
    proc = start([*watcher.args(name, name.split("-")[0]), "--duration", "8"], log)
    try:
        _joined(watcher, name, proc, log)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        stop(proc)
    text = log.read_text()
    assert "Traceback" not in text
    if name == "node-duration":  # its last line: deliveries and the trouble counters
        assert re.search(r"p2p node: stopped: \d+ deliveries; \S", text), text
    _left_gracefully(watcher, name)


def test_status_interrupted_exits_130_without_traceback(watcher: Watcher) -> None:
    log = watcher.root / "status.log"
    proc = start(["status", "--identity", str(watcher.root / "status"), "--wait", "60"], log)
    try:
        time.sleep(3)  # any moment must do; this one is usually inside the watch
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130, log.read_text()
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_telemetry_collector_ends_on_signals(watcher: Watcher, signum: int, code: int) -> None:
    log = watcher.root / f"collect-{signum}.log"
    landing = watcher.root / f"landing-{signum}"
    proc = start(
        ["telemetry", "collect", "--identity", str(watcher.root / "status"), str(landing)], log
    )
    try:
        wait_for("the collector", in_log(log, "collecting on"), log=log)
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == code, log.read_text()
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text()


EXAMPLE = [sys.executable, "-m"]


@pytest.mark.parametrize(
    ("example", "ready", "signum", "code"),
    [
        ("edge_examples.chat", "type to chat", signal.SIGINT, 130),
        ("edge_examples.sensor", "publishing on", signal.SIGINT, 130),
        ("edge_examples.game", "other player(s) found", signal.SIGINT, 130),
        ("edge_examples.game", "other player(s) found", signal.SIGTERM, 0),
    ],
)
def test_examples_end_on_signals(
    watcher: Watcher, example: str, ready: str, signum: int, code: int
) -> None:
    """The examples' long runs: exit 130 / 0 and no traceback (they use mDNS or their
    own options, so the leave itself is checked on ``p2p`` above)."""
    name = f"{example.split('.')[1]}-{signal.Signals(signum).name}"
    assert main_fleet_add(watcher.root, name)
    node = str(watcher.root / name)
    args = {
        "edge_examples.chat": ["--identity", node],
        "edge_examples.sensor": ["run", "--identity", node, "--settle", "0", "--no-mdns",
                                 "--seed", f"127.0.0.1:{watcher.port}", "--interval", "0.2"],
        "edge_examples.game": ["--identity", node, "--headless", "--duration", "60", "--no-mdns",
                               "--seed", f"127.0.0.1:{watcher.port}", "--settle", "0"],
    }[example]  # fmt: skip
    log = watcher.root / f"{name}.log"
    proc = start([example, *args], log, command=EXAMPLE, stdin=subprocess.PIPE)
    try:
        wait_for(f"{example} to start", in_log(log, ready), log=log)
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == code, log.read_text()
    finally:
        stop(proc)
    assert "Traceback" not in log.read_text()


def main_fleet_add(root: Path, name: str) -> bool:
    result = subprocess.run(
        [*P2P, "fleet", "add-node", str(root / "fleet"), str(root / name)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return result.returncode == 0

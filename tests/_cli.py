"""Helpers for tests that run ``p2p`` as real processes (``python -m p2p ...``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from p2p.cli import main

P2P = [sys.executable, "-m", "p2p"]


def make_fleet(tmp_path: Path, names: list[str], *, psk: bool = False) -> dict[str, str]:
    """A fleet in ``tmp_path/fleet`` and one member directory per name; their hex ids."""
    assert main(["fleet", "init", str(tmp_path / "fleet"), *(["--psk"] if psk else [])]) == 0
    ids = {}
    for name in names:
        assert main(["fleet", "add-node", str(tmp_path / "fleet"), str(tmp_path / name)]) == 0
        out = subprocess.run(
            [*P2P, "fleet", "show", str(tmp_path / name)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        ids[name] = out.stdout.split()[0]
    return ids


def as_from_a_terminal() -> None:
    """``preexec_fn``: SIGINT and SIGTERM at their defaults, in a session of the
    child's own (so a signal sent to it reaches no one else)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setsid()


def start(
    args: list[str], log: Path, *, command: list[str] = P2P, stdin: int = subprocess.DEVNULL
) -> subprocess.Popen[str]:
    """``p2p ARGS`` (or ``COMMAND ARGS``) in the background, unbuffered, stdout and
    stderr into ``log``."""
    fh = open(log, "w", encoding="utf-8")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        [*command, *args],
        stdout=fh,
        stderr=subprocess.STDOUT,
        stdin=stdin,
        text=True,
        preexec_fn=as_from_a_terminal,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def wait_for(
    what: str, check: Callable[[], bool], timeout: float = 30.0, log: Path | None = None
) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` (and the log) otherwise."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            text = log.read_text() if log is not None else ""
            raise AssertionError(f"timed out waiting for {what}\n{text}")
        time.sleep(0.1)


def in_log(log: Path, text: str) -> Callable[[], bool]:
    return lambda: text in log.read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stop(proc: subprocess.Popen[str]) -> None:
    """Kill ``proc`` if it still runs (test cleanup)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def assert_one_error_line(
    result: subprocess.CompletedProcess[str], code: int, *fragments: str
) -> str:
    """Exit ``code``, no traceback, and stderr exactly one ``p2p: error:`` line
    holding every fragment; returns the line."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("p2p: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.returncode == code, (result.returncode, result.stderr)
    return lines[0]


def sim_lines(
    tmp_path: Path, lines: list[str], nodes: int, name: str = "s"
) -> tuple[dict[str, Any], Path]:
    """``p2p sim`` (in-process) on scenario ``lines`` with ``--metrics`` and
    ``--trace``: the metrics document and the trace's path (exit 0 asserted)."""
    scenario = tmp_path / f"{name}.txt"
    scenario.write_text("\n".join(lines) + "\n")
    metrics, trace = tmp_path / f"{name}.json", tmp_path / f"{name}.jsonl"
    args = ["sim", str(scenario), "--nodes", str(nodes), "--metrics", str(metrics)]
    assert main([*args, "--trace", str(trace)]) == 0
    return json.loads(metrics.read_text()), trace

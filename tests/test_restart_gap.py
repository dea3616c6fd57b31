"""A subscriber killed with SIGKILL and started again: what it missed is counted.

Two real ``p2p node`` processes on loopback (``--no-mdns``, the subscriber
seeds the publisher).  The publisher sends :data:`COUNT` messages at
:data:`RATE` per second; :data:`KILL_AT` seconds after the subscriber
started it is killed with SIGKILL, and :data:`DOWN_FOR` seconds later it is
started again with the same node directory.  Its frontier file
(``frontier.0`` and ``.1``) tells the new process what the old one delivered, so
the new process's first delivery carries the count of publications it will
not get (a ``gap`` line in its trace).

What holds: each publication the publisher made from the subscriber's first
delivery on is delivered once (never twice, across the two processes) or
counted in a gap, exactly (the frontier is written after every batch of
deliveries, and a killed process loses no write); the traces pass the trace
checks, which refuse a gap counting more than was not delivered.  Every process is
killed at the end, even on failure.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bench._preauth import free_port
from p2p.sim import check_trace, format_violations
from p2p.sim._tracefile import load_traces

COUNT = 600
RATE = 50.0
KILL_AT = 6.0
DOWN_FOR = 4.0


def _fleet(root: Path) -> tuple[Path, Path]:
    p2p = [sys.executable, "-m", "p2p", "fleet"]
    subprocess.run([*p2p, "init", str(root / "fleet"), "--psk"], check=True, capture_output=True)
    dirs = (root / "pub", root / "sub")
    for d in dirs:
        subprocess.run([*p2p, "add-node", str(root / "fleet"), str(d)], check=True,
                       capture_output=True)  # fmt: skip
    return dirs


def _node(d: Path, trace: Path, *role: str, duration: float) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "p2p", "node", "--identity", str(d), "--interface",
            "127.0.0.1", "--no-mdns", "--trace", str(trace), "--duration", f"{duration:.0f}",
            *role]  # fmt: skip
    with open(trace.with_suffix(".err"), "wb") as err:  # the child keeps its own copy
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)


@pytest.mark.slow
def test_a_killed_subscriber_counts_what_it_missed(tmp_path: Path) -> None:
    pub_dir, sub_dir = _fleet(tmp_path)
    port = free_port()
    seed = ["--seed", f"127.0.0.1:{port}"]
    span = COUNT / RATE + 12
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_node(pub_dir, tmp_path / "pub.jsonl", *seed, "--port", str(port), "--publish",
                           "t", "--count", str(COUNT), "--rate", str(RATE), "--settle", "3",
                           duration=span))  # fmt: skip
        first = _node(sub_dir, tmp_path / "sub1.jsonl", *seed, "--subscribe", "t", "--count",
                      "0", "--settle", "0", duration=span)  # fmt: skip
        procs.append(first)
        time.sleep(KILL_AT)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        time.sleep(DOWN_FOR)
        procs.append(_node(sub_dir, tmp_path / "sub2.jsonl", *seed, "--subscribe", "t",
                           "--count", "0", "--settle", "0",
                           duration=span - KILL_AT - DOWN_FOR))  # fmt: skip
        for p in (procs[0], procs[2]):
            assert p.wait(span + 30) == 0, (tmp_path / "pub.err").read_text()[-2000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    traces = [tmp_path / n for n in ("pub.jsonl", "sub1.jsonl", "sub2.jsonl")]
    loaded = load_traces(traces)
    found = check_trace(loaded.events)
    assert not found, format_violations(found)
    rows = [json.loads(x) for t in traces for x in t.read_text().splitlines() if x.strip()]
    pub_id = json.loads((tmp_path / "pub.jsonl").read_text().splitlines()[0])["node"]
    made = [r["seq"] for r in rows if r["event"] == "publish" and r["node"] == pub_id]
    got = Counter(r["seq"] for r in rows if r["event"] == "deliver" and r["node"] != pub_id)
    missed = sum(r["seq"] for r in rows if r["event"] == "gap")
    assert len(made) == COUNT
    assert max(got.values()) == 1, "a publication delivered twice across the restart"
    start = next(i for i, seq in enumerate(made) if seq in got)
    owed = len(made) - start
    report = f"owed {owed}, delivered {len(got)}, reported missed {missed}"
    print(report)
    assert missed > 0, report  # the restart lost some, and said so
    assert len(got) + missed == owed, report  # exactly: a killed process loses no write
    err = (tmp_path / "sub2.err").read_text()
    assert "missed" in err, err[-2000:]  # the warning line

"""A boot storm on real ``p2p node`` processes: many nodes start at once.

As a building whose power comes back: :data:`NODES` processes start together
in one network namespace of their own (its loopback only, ``--no-mdns``).
Node 1 and node 2 seed each other; every other node seeds node 1, so the
seed is dialled by a burst of newcomers.  The subscribers subscribe after the
default ``--settle``, most of them knowing few members; node 0 publishes
:data:`COUNT` messages at :data:`RATE` per second after ``--warmup`` seconds.

What must hold (:func:`problems`): every node exits 0 without a traceback;
the seed answers every newcomer (no handshake timed out); the traces pass
``check_trace`` (causal order, FIFO, exactly once, and validity against the
publisher's view carried by each ``publish`` line); and every subscriber
delivers all :data:`COUNT` publications.  Reported (:func:`report`): the time
from the start to each node's first delivery, the subscribers' view sizes
when they subscribed, handshake time-outs.

``python tests/_storm.py [--nodes 128] [--warmup 60] [--runs 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _netns import Lan, sigterm_raises, unavailable

from p2p.sim import TraceEvent, check_trace, format_violations

NODES = 128
COUNT = 200
RATE = 20.0
TOPIC = "chat"
SEED_PORT = 7400
TAIL = 30.0
"""Seconds the nodes run after the last publication."""


def _fleet(root: Path, n: int) -> list[Path]:
    p2p = [sys.executable, "-m", "p2p", "fleet"]
    subprocess.run([*p2p, "init", str(root / "fleet"), "--psk"], check=True, capture_output=True)
    dirs = [root / f"n{i:03d}" for i in range(n)]
    for start in range(0, n, 32):  # a few at a time: each is a Python start-up
        procs = [
            subprocess.Popen(
                [*p2p, "add-node", str(root / "fleet"), str(d)], stdout=subprocess.PIPE
            )
            for d in dirs[start : start + 32]
        ]
        for p in procs:
            p.communicate(timeout=300)
            if p.returncode != 0:
                raise AssertionError("p2p fleet add-node failed")
    return dirs


def _argv(i: int, d: Path, warmup: float, duration: float) -> list[str]:
    seeds = {1: [2], 2: [1]}.get(i, [1])
    found = ["--no-mdns", *[a for s in seeds for a in ("--seed", f"127.0.0.1:{SEED_PORT + s}")]]
    if i in (1, 2):
        found += ["--port", str(SEED_PORT + i)]
    role = ["--subscribe", TOPIC, "--count", "0"]
    if i == 0:
        role = [
            "--publish",
            TOPIC,
            "--count",
            str(COUNT),
            "--rate",
            str(RATE),
            "--settle",
            str(warmup),
        ]
    return [
        sys.executable, "-m", "p2p", "node", "--identity", str(d), "--interface", "127.0.0.1",
        *found, *role, "--duration", f"{duration:.0f}", "--trace", str(d / "trace.jsonl"),
    ]  # fmt: skip


def run(root: Path, n: int, warmup: float, progress: bool = False) -> dict[str, Any]:
    """Start ``n`` nodes at once in a namespace of their own; wait for all; the findings."""
    dirs = _fleet(root, n)
    duration = warmup + COUNT / RATE + TAIL
    with Lan(1) as net:
        host = net.hosts[0]
        start = time.time()
        procs = []
        for i, d in enumerate(dirs):
            argv = _argv(i, d, warmup, duration)
            with open(os.devnull, "wb") as null, open(d / "stderr.log", "wb") as err:
                procs.append(net.spawn(host, argv, stdout=null, stderr=err))
        if progress:
            print(f"storm: {n} nodes started in {time.time() - start:.1f} s", flush=True)
        codes: list[int | None] = []
        for p in procs:
            try:
                codes.append(p.wait(max(1.0, start + duration + 90 - time.time())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    return _findings(dirs, codes, start)


def _rows(d: Path) -> list[dict[str, Any]]:
    path = d / "trace.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(x) for x in text.splitlines(keepends=True) if x.endswith("\n")]


def _findings(dirs: list[Path], codes: list[int | None], start: float) -> dict[str, Any]:
    rows = [_rows(d) for d in dirs]
    index = {r[0]["node"]: i for i, r in enumerate(rows) if r}
    trace: list[TraceEvent] = []
    for i, rs in enumerate(rows):
        for r in rs:
            src = index.get(r["source"]) if r["source"] is not None else None
            view = tuple(sorted(index[v] for v in r["view"] if v in index)) if "view" in r else None
            trace.append(TraceEvent(r["time"], i, r["event"], r["topic"], src, r["seq"], view))
    logs = [(d / "stderr.log").read_text(errors="replace") for d in dirs]
    delivered = Counter(e.node for e in trace if e.event == "deliver" and e.source == 0)
    first = {
        e.node: e.time - start for e in reversed(trace) if e.event == "deliver" and e.source == 0
    }
    views = [
        int(m.group(1))
        for log in logs[1:]
        for m in [re.search(r"subscribed to 'chat' \((\d+) members\)", log)]
        if m
    ]
    firsts = sorted(first.values())
    return {
        "nodes": len(dirs),
        "exit_codes": dict(Counter(str(c) for c in codes)),
        "tracebacks": sum("Traceback" in log for log in logs),
        "handshake_timeouts": sum(log.count("timed out (handshake_timeout)") for log in logs),
        "subscribed_view_sizes": {
            "min": min(views, default=0),
            "median": statistics.median(views) if views else 0,
            "max": max(views, default=0),
        },
        "delivered": {
            "subscribers_complete": sum(1 for i in range(1, len(dirs)) if delivered[i] == COUNT),
            "subscribers": len(dirs) - 1,
            "total": sum(delivered[i] for i in range(1, len(dirs))),
            "expected": COUNT * (len(dirs) - 1),
        },
        "first_delivery_s": {
            "min": round(firsts[0], 2),
            "median": round(statistics.median(firsts), 2),
            "max": round(firsts[-1], 2),
        }
        if firsts
        else None,
        "violations": _violations(trace),
    }


def _violations(trace: list[TraceEvent]) -> str | None:
    found = check_trace(trace, quiescent=True)
    return format_violations(found) if found else None


def problems(found: dict[str, Any]) -> list[str]:
    out = []
    if set(found["exit_codes"]) != {"0"}:
        out.append(f"exit codes {found['exit_codes']}")
    if found["tracebacks"]:
        out.append(f"{found['tracebacks']} nodes logged a traceback")
    if found["handshake_timeouts"]:
        out.append(f"{found['handshake_timeouts']} handshakes timed out")
    d = found["delivered"]
    if d["subscribers_complete"] != d["subscribers"]:
        complete, subs = d["subscribers_complete"], d["subscribers"]
        out.append(f"only {complete} of {subs} subscribers delivered all {COUNT}")
    if found["violations"]:
        out.append(found["violations"])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=NODES)
    p.add_argument("--warmup", type=float, default=60.0)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--out", type=Path)
    p.add_argument("--keep", type=Path)
    args = p.parse_args()
    reason = unavailable()
    if reason is not None:
        print(f"storm: {reason}", file=sys.stderr)
        return 2
    results = []
    for k in range(args.runs):
        with sigterm_raises(), tempfile.TemporaryDirectory() as tmp:
            found = run(Path(tmp), args.nodes, args.warmup, progress=True)
            found["problems"] = problems(found)
            if args.keep:
                import shutil

                shutil.copytree(
                    tmp,
                    args.keep / f"run{k}",
                    dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("fleet", "*.key"),
                )
        results.append(found)
        print(json.dumps(found, indent=1), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 1 if any(r["problems"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

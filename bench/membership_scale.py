"""Membership at scale on one host: N real ``p2p node`` processes (issue 19).

``python -m bench.membership_scale [--nodes 64] [--discovery seeds|mdns]
[--warmup 60] [--messages 200] [--rate 5] [--no-kill] [--keep DIR] [--out FILE]``

Every node is its own process (as on a fleet of devices, but all on this
host's cores, so each sees scheduling delays a real device would not), finds
the others through one static seed (node 0) or mDNS on 127.0.0.1, and
subscribes to ``chat``; node 0 publishes ``--messages`` messages at
``--rate`` per second after ``--warmup`` seconds; 3 s after the last
publication the last node is SIGKILLed.  Reported, from every node's log and
trace:

* false suspicions (every ``suspect`` line not about the killed node),
  self-restarts (``back as incarnation``), loop stalls the nodes noticed
  (Lifeguard's local health);
* detection of the SIGKILL: seconds from the kill to each other node's
  suspicion of the victim (median, max, and nodes that never suspected it);
* the CPU the whole fleet used, as cores busy in each 5 s interval;
* deliveries: per subscriber, how many of the publications made after its
  (last) subscription was confirmed it delivered, and the totals;
* the simulator's trace checks (causal order, FIFO, exactly-once, validity)
  on the merged traces;
* the load average before and after, since this host's load decides much.

Writes ``bench/results/membership_scale_<N>_<discovery>.json``.  Every node is
killed on exit, whatever happens.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from p2p.sim import TraceEvent, check_trace, format_violations

RESULTS = Path(__file__).parent / "results"
TOPIC = "chat"


def _fleet(root: Path, n: int) -> list[Path]:
    run = [sys.executable, "-m", "p2p", "fleet"]
    subprocess.run([*run, "init", str(root / "fleet"), "--psk"], check=True, capture_output=True)
    dirs = [root / f"n{i:03d}" for i in range(n)]
    procs = [
        subprocess.Popen([*run, "add-node", str(root / "fleet"), str(d)], stdout=subprocess.PIPE)
        for d in dirs
    ]
    for p in procs:
        p.communicate(timeout=120)
    return dirs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _argv(args: argparse.Namespace, i: int, d: Path, seed: int, stype: str) -> list[str]:
    duration = args.warmup + args.messages / args.rate + args.tail
    found = ["--service-type", stype]
    if args.discovery == "seeds":
        found = ["--no-mdns", "--seed", f"127.0.0.1:{seed}"]
        if i == 0:
            found += ["--port", str(seed)]
    pub = ["--publish", TOPIC, "--count", str(args.messages), "--rate", str(args.rate)]
    return [
        sys.executable, "-m", "p2p", "node", "--identity", str(d), *found,
        "--subscribe", TOPIC, *(pub if i == 0 else ["--count", "0"]),
        "--settle", str(args.warmup if i == 0 else 2.0), "--duration", str(duration),
        "--trace", str(d / "trace.jsonl"),
    ]  # fmt: skip


CPU_EVERY = 5.0
"""Seconds between two samples of the nodes' CPU time."""
KILL_AFTER = 3.0
"""Seconds after the last publication at which the last node is SIGKILLed."""


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (``None`` once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sample_cpu(
    procs: list[subprocess.Popen[bytes]], cpu: list[tuple[float, float]], last: dict[int, float]
) -> None:
    """Append (time, CPU seconds of every node so far); a node that exited
    keeps its ``last`` reading, so the series never goes down."""
    for p in procs:
        seconds = _cpu_seconds(p.pid)
        if seconds is not None:
            last[p.pid] = seconds
    cpu.append((time.monotonic(), sum(last.values())))


def _cores_used(cpu: list[tuple[float, float]]) -> list[float]:
    """Cores the whole fleet kept busy in each sampling interval."""
    return [
        round((c1 - c0) / (t1 - t0), 2) for (t0, c0), (t1, c1) in itertools.pairwise(cpu) if t1 > t0
    ]


def _run(
    args: argparse.Namespace, dirs: list[Path], cpu: list[tuple[float, float]]
) -> tuple[list[int | None], float | None]:
    """Run the fleet; returns the exit codes and the wall-clock time at which
    the last node was killed (``None``: ``--no-kill``, or it had exited)."""
    seed = _free_port()
    stype = f"_ms{os.getpid() % 100000}._tcp.local."
    procs = []
    try:
        for i, d in enumerate(dirs):
            with open(d / "stderr.log", "wb") as err:
                procs.append(
                    subprocess.Popen(
                        _argv(args, i, d, seed, stype), stdout=subprocess.DEVNULL, stderr=err
                    )
                )
            if i == 0:
                time.sleep(1.0)  # the seed listens first
        started = time.monotonic()
        bound = args.warmup + args.messages / args.rate + args.tail + 60
        deadline = started + bound
        kill_at = started + args.warmup + args.messages / args.rate + KILL_AFTER
        killed: float | None = None
        to_kill = args.kill
        last: dict[int, float] = {}
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            _sample_cpu(procs, cpu, last)
            if to_kill and time.monotonic() >= kill_at:
                to_kill = False
                if procs[-1].poll() is None:
                    procs[-1].kill()  # SIGKILL: no leave, the detector must find it
                    killed = time.time()
            pause = max(0.05, kill_at - time.monotonic()) if to_kill else CPU_EVERY
            time.sleep(min(CPU_EVERY, pause))
        codes: list[int | None] = []
        for p in procs:
            try:
                codes.append(p.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes, killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _traces(dirs: list[Path]) -> list[TraceEvent]:
    index: dict[str, int] = {}
    rows = []
    for i, d in enumerate(dirs):
        path = d / "trace.jsonl"
        for line in path.read_text().splitlines() if path.exists() else ():
            row = json.loads(line)
            index.setdefault(row["node"], i)
            rows.append((i, row))
    events = []
    for i, r in rows:
        source = None if r["source"] is None else index.get(r["source"], -1)
        events.append(TraceEvent(r["time"], i, r["event"], r["topic"], source, r["seq"]))
    return events


def _deliveries(trace: list[TraceEvent], n: int, killed: bool) -> dict[str, Any]:
    """Per subscriber, the publications of node 0 made after its last confirmed
    subscription, and how many of those it delivered.  The ``killed`` last
    node is reported apart: what was in flight when it died is not owed."""
    published = [(e.seq, e.time) for e in trace if e.event == "publish" and e.node == 0]
    confirmed: dict[int, float] = {}
    got: dict[int, set[int]] = {i: set() for i in range(n)}
    for e in trace:
        if e.event == "subscribed":
            confirmed[e.node] = e.time
        elif e.event == "deliver" and e.source == 0 and e.seq is not None:
            got[e.node].add(e.seq)
    owed = {i: {s for s, t in published if t > confirmed.get(i, float("inf"))} for i in range(n)}
    victim = {}
    if killed:
        victim = {"killed_node_delivered": len(got.pop(n - 1)), "of": len(owed.pop(n - 1))}
    short = {i: len(owed[i] - got[i]) for i in owed if owed[i] - got[i]}
    return {
        **victim,
        "published": len(published),
        "subscribers_confirmed": len(confirmed),
        "owed": sum(len(o) for o in owed.values()),
        "delivered_of_owed": sum(len(owed[i] & got[i]) for i in owed),
        "delivered_total": sum(len(g) for g in got.values()),
        "possible_total": len(published) * len(owed),
        "subscribers_missing_some": len(short),
        "missing_by_node": short,
        "never_confirmed": sorted(set(range(n)) - set(confirmed)),
    }


def _detection(dirs: list[Path], killed: float | None, victim: str | None) -> dict[str, Any]:
    """Seconds from the SIGKILL of ``victim`` (the last node) to each other
    node's suspicion of it (from the log lines' timestamps, this host's clock)."""
    if killed is None or victim is None:
        return {}
    times, missed = [], 0
    for d in dirs[:-1]:
        seen = [
            time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + int(line[20:23]) / 1000
            for line in (d / "stderr.log").read_text(errors="replace").splitlines()
            if f"WARNING suspect {victim}" in line
        ]
        after = [t - killed for t in seen if t >= killed - 1]
        if after:
            times.append(round(after[0], 2))
        else:
            missed += 1
    times.sort()
    return {
        "victim": victim,
        "median_s": times[len(times) // 2] if times else None,
        "max_s": times[-1] if times else None,
        "nodes_that_never_suspected_it": missed,
    }


def _victim(dirs: list[Path]) -> str:
    """The id the last node printed when it started listening."""
    words = (dirs[-1] / "stderr.log").read_text(errors="replace").split()
    return words[words.index("node") + 1] if "node" in words else "?"


def _logs(dirs: list[Path], victim: str | None) -> dict[str, int]:
    """Counts of log lines; a suspicion of the killed ``victim`` is not a false one."""
    counts: Counter[str] = Counter()
    for d in dirs:
        text = (d / "stderr.log").read_text(errors="replace")
        rightly = text.count(f" WARNING suspect {victim}") if victim else 0
        counts["false_suspicions"] += text.count(" WARNING suspect ") - rightly
        counts["self_restarts"] += text.count("back as incarnation")
        counts["stall_warnings"] += text.count("this node stalled")
        counts["tracebacks"] += text.count("Traceback")
        counts["nodes_restarting_twice_or_more"] += text.count("back as incarnation") >= 2
        counts["outbox_full_errors"] += text.count("outbox to ")
        counts.update(_stopped_counters(text))
    return dict(counts)


def _stopped_counters(text: str) -> Counter[str]:
    """The trouble counters a node prints when it stops (``p2p node``'s last
    line, ``stopped: N deliveries; name value, ...``), as ``node_<name>``."""
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if "stopped:" not in line or ";" not in line:
            continue
        for part in line.split(";", 1)[1].split(","):
            name, _, value = part.strip().rpartition(" ")
            if value.isdigit():
                out[f"node_{name.replace(' ', '_')}"] += int(value)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.membership_scale", description=__doc__)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--discovery", choices=("seeds", "mdns"), default="seeds")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds before node 0 publishes")
    p.add_argument("--messages", type=int, default=200)
    p.add_argument("--rate", type=float, default=5.0)
    p.add_argument("--tail", type=float, default=20.0, help="seconds after the last publication")
    p.add_argument(
        "--no-kill",
        dest="kill",
        action="store_false",
        help=f"do not SIGKILL the last node {KILL_AFTER:g} s after the last publication",
    )
    p.add_argument("--out", type=Path)
    p.add_argument("--keep", type=Path, help="keep the nodes' logs and traces in this directory")
    args = p.parse_args(argv)
    if args.nodes < 2 or args.messages < 1 or args.rate <= 0:
        p.error("need --nodes >= 2, --messages >= 1, --rate > 0")
    out = args.out or RESULTS / f"membership_scale_{args.nodes}_{args.discovery}.json"
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "keep")}
    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="membership-scale-") as scratch:
        tmp = args.keep or Path(scratch)
        print(f"creating {args.nodes} identities ...", file=sys.stderr, flush=True)
        dirs = _fleet(Path(tmp), args.nodes)
        print(f"running {args.nodes} nodes ({args.discovery}) ...", file=sys.stderr, flush=True)
        cpu: list[tuple[float, float]] = []
        codes, killed = _run(args, dirs, cpu)
        victim = _victim(dirs) if killed is not None else None
        trace = _traces(dirs)
        violations = check_trace(trace, quiescent=False)
        doc = {
            "benchmark": "membership_scale",
            "nodes": args.nodes,
            "discovery": args.discovery,
            "settings": settings,
            "exit_codes": dict(Counter(str(c) for c in codes)),
            "logs": _logs(dirs, victim),
            "detection_of_a_sigkill": _detection(dirs, killed, victim),
            "deliveries": _deliveries(trace, args.nodes, killed is not None),
            "trace_violations": len(violations),
            "trace_violations_first": format_violations(violations, limit=5) if violations else "",
            "cores_used_every_5s": _cores_used(cpu),
            "cpu_seconds_total": round(cpu[-1][1], 1) if cpu else None,
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "seconds": time.monotonic() - started,
        }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    d, lg, det = doc["deliveries"], doc["logs"], doc["detection_of_a_sigkill"]
    print(
        f"{args.nodes} nodes ({args.discovery}): delivered {d['delivered_of_owed']}/{d['owed']} "
        f"owed ({d['delivered_total']}/{d['possible_total']} in all), "
        f"{d['subscribers_missing_some']} subscribers missing some, never confirmed "
        f"{len(d['never_confirmed'])}; false suspicions {lg.get('false_suspicions', 0)}, "
        f"self-restarts {lg.get('self_restarts', 0)}, stall warnings {lg.get('stall_warnings', 0)}"
        f"; SIGKILL detected in {det.get('median_s')} s median, {det.get('max_s')} s max"
        f"; trace violations {doc['trace_violations']}; load {load_before[0]:.1f} -> "
        f"{doc['load_after'][0]:.1f}; written to {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Chaos run on a LAN of network namespaces: real ``p2p node`` processes, SIGKILL, restarts.

Eight nodes, one per namespace (``tests/_netns.py``), find each other by mDNS
and all subscribe to ``chaos``; nodes 0, 1 and 2 publish there at a steady
rate.  While they publish, :data:`SCHEDULE` kills a publisher (2) and two
relays (5, 6) with SIGKILL (no leave, sockets closed by the kernel) and
restarts two of them (5 as a subscriber, 2 as a publisher again) as new
processes with the same identity, hence new incarnations.  Every process
writes its trace (flushed per line, so a killed one keeps it) and its log.

:func:`problems` then checks, from the traces alone: causal order per topic,
per-source FIFO, exactly-once, agreement and validity (``check_trace`` with
``quiescent=True``, each killed process ending in a ``crash`` event at its
kill time, each restart a node of its own), and that every publication of a
publisher that stayed up reached every subscriber that stayed up exactly
once, in order, with nothing missing after the subscriber's confirmation.
:func:`report` measures, per kill, the time to detect (kill to the last
surviving node's ``suspect`` log line about it) and the time to repair (kill
to the last delivery, at every surviving subscriber, of what surviving
publishers published from just before the kill until its detection).

``python tests/_chaos.py [--out FILE]`` runs it once outside pytest (root
needed) and writes that report; ``tests/test_chaos_netns.py`` is the test.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: siblings importable

from _netns import Lan, sigterm_raises, unavailable
from test_system_netns import NodeRun, Role, _delivered_ok, make_fleet

__all__ = ["ChaosRun", "Life", "NodeRun", "Role", "load", "problems", "report", "run"]

from p2p.sim import TraceEvent, check_trace, format_violations

NODES = 8
TOPIC = "chaos"
PUBLISHERS = (0, 1, 2)
RATE = 5.0
"""Publications per second per publisher."""
COUNT = 100
"""Publications per publisher's first life (20 s at RATE)."""
RESTART_COUNT = 20
"""Publications of a restarted publisher."""
SETTLE = 6.0
"""Seconds of mDNS discovery before subscribing (first lives)."""
RESTART_SETTLE = 3.0
END = 45.0
"""Seconds after the first spawn at which every process stops."""
SCHEDULE: tuple[tuple[float, str, int], ...] = (
    (14.0, "kill", 2),
    (14.0, "kill", 5),
    (18.0, "start", 5),
    (20.0, "kill", 6),
    (22.0, "start", 2),
)
"""``(seconds after the first spawn, kill|start, node)``; publishing runs from
about 7 s to 27 s, so every kill lands mid-stream."""


@dataclass(slots=True)
class Life:
    """One process of one node: the node runs again as a new life after a restart."""

    node: int
    life: int
    run: NodeRun
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    killed: float | None = None
    count: int = 0
    """Publications it was asked to make (0: subscriber only)."""
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def index(self) -> int:
        """Its node index in the checked trace: a restart is a node of its own."""
        return self.node + NODES * self.life

    @property
    def stayed_up(self) -> bool:
        """Ran the whole time: first life, never killed."""
        return self.life == 0 and self.killed is None


@dataclass(slots=True)
class ChaosRun:
    """What one run did: its lives (in start order), and the kills' times."""

    lives: list[Life]
    kills: list[tuple[int, float]] = field(default_factory=list)
    """``(node, wall time)`` of each SIGKILL."""
    trace: list[TraceEvent] = field(default_factory=list)
    load_problems: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ running


def roles() -> list[Role]:
    """Publishers publish on TOPIC (and so subscribe to it); the others subscribe."""
    return [Role(TOPIC) if i in PUBLISHERS else Role("", (TOPIC,)) for i in range(NODES)]


def _argv(life: Life, *, duration: float, settle: float) -> list[str]:
    run = life.run
    publish = ["--publish", TOPIC, "--count", str(life.count), "--rate", str(RATE)]
    return [
        sys.executable, "-m", "p2p", "node", "--identity", str(run.identity),
        "--interface", run.address, *(publish if life.count else ["--subscribe", TOPIC]),
        "--duration", f"{duration:.2f}", "--trace", str(run.trace), "--settle", str(settle),
    ]  # fmt: skip


def _start(net: Lan, base: NodeRun, life: int, out: Path, duration: float) -> Life:
    host = net.hosts[base.index]
    name = f"node{base.index}.{life}"
    run = NodeRun(
        base.index, base.node_id, base.identity, base.role, host.netns, host.address,
        out / f"{name}.jsonl", out / f"{name}.err",
    )  # fmt: skip
    count = 0 if base.index not in PUBLISHERS else (COUNT if life == 0 else RESTART_COUNT)
    lf = Life(base.index, life, run, count=count)
    settle = SETTLE if life == 0 else RESTART_SETTLE
    with open(out / f"{name}.out", "wb") as so, open(run.stderr, "wb") as se:
        lf.proc = net.spawn(host, _argv(lf, duration=duration, settle=settle), stdout=so, stderr=se)
    lf.started = time.time()
    return lf


def run(net: Lan, root: Path, progress: bool = False) -> ChaosRun:
    """Make the fleet, run :data:`SCHEDULE`, wait for every process; load the traces."""
    base = make_fleet(root, roles(), psk=False)
    out = root / "out"
    out.mkdir()
    t0 = time.monotonic()
    lives = [_start(net, b, 0, out, END) for b in base]
    chaos = ChaosRun(lives)
    for at, action, node in SCHEDULE:
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        if action == "kill":
            victim = next(lf for lf in reversed(lives) if lf.node == node)
            assert victim.proc is not None
            victim.killed = time.time()
            os.killpg(victim.proc.pid, signal.SIGKILL)
            chaos.kills.append((node, victim.killed))
        else:
            life = 1 + max(lf.life for lf in lives if lf.node == node)
            lives.append(_start(net, base[node], life, out, END - at))
        if progress:
            print(f"chaos: t={time.monotonic() - t0:5.1f} s {action} node {node}", flush=True)
    for lf in lives:
        assert lf.proc is not None
        try:
            lf.run.returncode = lf.proc.wait(max(1.0, t0 + END + 45 - time.monotonic()))
        except subprocess.TimeoutExpired:
            chaos.load_problems.append(f"node {lf.node} life {lf.life} still runs at the end")
    chaos.trace, unmapped = load(lives)
    chaos.load_problems += unmapped
    return chaos


# ------------------------------------------------------------------ traces


def _rows(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a trace; a SIGKILL may cut the last one short."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def load(lives: Sequence[Life]) -> tuple[list[TraceEvent], list[str]]:
    """Every life's trace as checker events: node = :attr:`Life.index`, a delivery's
    source = the life that published it (by id *and* incarnation), a killed life
    ending with ``crash``.  Also what could not be mapped."""
    for lf in lives:
        lf.rows = _rows(lf.run.trace)
    owner: dict[tuple[str, int], int] = {}
    for lf in lives:
        for row in lf.rows:
            if row["event"] not in ("deliver", "gap"):  # own events: the node's own incarnation
                owner[(row["node"], row["inc"])] = lf.index
    events: list[TraceEvent] = []
    problems: list[str] = []
    for lf in lives:
        for row in lf.rows:
            source = owner.get((row["source"], row["inc"]))
            if source is None:
                problems.append(f"life {lf.index}: {row} from an unknown incarnation")
                continue
            if row["event"] not in ("deliver", "publish", "gap"):
                source = None
            events.append(
                TraceEvent(row["time"], lf.index, row["event"], row["topic"], source, row["seq"])
            )
        if lf.killed is not None:
            events.append(TraceEvent(lf.killed, lf.index, "crash", "", None, None))
    return events, problems


# ------------------------------------------------------------------ checks


def problems(chaos: ChaosRun) -> list[str]:
    """Everything wrong with the run (empty when every promise held)."""
    found = list(chaos.load_problems)
    violations = check_trace(chaos.trace, quiescent=True)
    if violations:
        found.append(format_violations(violations))
    found += _process_problems(chaos)
    found += _survivor_problems(chaos)
    return found


def _process_problems(chaos: ChaosRun) -> list[str]:
    """Exit codes, errors logged, kills mid-stream, every life subscribed."""
    found = []
    confirmed = {e.node for e in chaos.trace if e.event == "subscribed" and e.topic == TOPIC}
    published: dict[int, int] = defaultdict(int)
    for e in chaos.trace:
        if e.event == "publish":
            published[e.node] += 1
    for lf in chaos.lives:
        err = lf.run.stderr.read_text(errors="replace")
        who = f"node {lf.node} life {lf.life}"
        if lf.killed is None and lf.run.returncode != 0:
            found.append(f"{who} exited with {lf.run.returncode}")
        if "Traceback" in err:
            found.append(f"{who} logged a traceback")
        if lf.index not in confirmed:
            found.append(f"{who}: its subscription was never confirmed")
        made = published[lf.index]
        if lf.killed is not None and lf.count and not 0 < made < lf.count:
            found.append(f"{who} was killed after {made}/{lf.count} publications, not mid-stream")
        if lf.killed is None and made != lf.count:
            found.append(f"{who} published {made}, expected {lf.count}")
    return found


def _survivor_problems(chaos: ChaosRun) -> list[str]:
    """Each publisher that stayed up reached each subscriber that stayed up: every
    publication after the subscriber's confirmation, once, in order."""
    made: dict[int, list[tuple[int, float]]] = defaultdict(list)
    got: dict[tuple[int, int], list[int]] = defaultdict(list)
    since: dict[int, float] = {}
    for e in chaos.trace:
        if e.event == "publish" and e.seq is not None and e.source is not None:
            made[e.source].append((e.seq, e.time))
        elif e.event == "deliver" and e.seq is not None and e.source is not None:
            got[(e.node, e.source)].append(e.seq)
        elif e.event == "subscribed":
            since[e.node] = e.time
    up = [lf.index for lf in chaos.lives if lf.stayed_up]
    found = []
    for src in (i for i in up if i in PUBLISHERS):
        for node in (i for i in up if i in since):
            found += _delivered_ok(TOPIC, src, node, made[src], got[(node, src)], since[node])
    return found


# ------------------------------------------------------------------ report


def _suspicions(life: Life) -> dict[str, float]:
    """First ``suspect <id>`` log line per suspected id: id -> wall time."""
    seen: dict[str, float] = {}
    for line in life.run.stderr.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[4] == "suspect":
            at = datetime.strptime(f"{parts[0]} {parts[1]}", "%Y-%m-%d %H:%M:%S,%f").timestamp()
            seen.setdefault(parts[5], at)
    return seen


def report(chaos: ChaosRun) -> dict[str, Any]:
    """Per kill: seconds to detect (first and last survivor) and to repair."""
    survivors = [lf for lf in chaos.lives if lf.stayed_up]
    seen = [_suspicions(lf) for lf in survivors]
    kills: list[dict[str, Any]] = []
    for node, at in chaos.kills:
        victim = next(lf for lf in chaos.lives if lf.killed == at and lf.node == node)
        times = [s[victim.run.node_id] - at for s in seen if victim.run.node_id in s]
        detect = max(times) if len(times) == len(survivors) else None
        kills.append({
            "node": node, "role": "publisher" if victim.count else "relay",
            "detected_by": f"{len(times)}/{len(survivors)}",
            "detect_first_s": min(times) if times else None, "detect_s": detect,
            "repair_s": _repair(chaos, survivors, at, detect),
        })  # fmt: skip
    done = [k["detect_s"] for k in kills if k["detect_s"] is not None]
    return {
        "nodes": NODES, "publishers": len(PUBLISHERS), "rate": RATE, "kills": kills,
        "restarts": sum(1 for _, action, _ in SCHEDULE if action == "start"),
        "detect_median_s": statistics.median(done) if done else None,
        "deliveries": sum(1 for e in chaos.trace if e.event == "deliver"),
    }  # fmt: skip


def _repair(
    chaos: ChaosRun, survivors: list[Life], kill: float, detect: float | None
) -> float | None:
    """Kill to the last delivery, at any survivor, of what surviving publishers
    published between one second before the kill and its detection."""
    if detect is None:
        return None
    ups = {lf.index for lf in survivors}
    window = {
        (e.source, e.seq) for e in chaos.trace
        if e.event == "publish" and e.node in ups and kill - 1 <= e.time <= kill + detect
    }  # fmt: skip
    last = [
        e.time for e in chaos.trace
        if e.event == "deliver" and e.node in ups and (e.source, e.seq) in window
    ]  # fmt: skip
    return max(last) - kill if last else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the report (JSON) here")
    args = p.parse_args()
    reason = unavailable()
    if reason is not None:
        print(f"chaos: {reason}", file=sys.stderr)
        return 2
    with sigterm_raises(), tempfile.TemporaryDirectory() as tmp, Lan(NODES) as net:
        chaos = run(net, Path(tmp), progress=True)
        result = {**report(chaos), "problems": problems(chaos)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())

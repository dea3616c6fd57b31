"""A LAN that splits in two and heals, on real ``p2p node`` processes.

Six nodes, each in a network namespace of its own on one bridge
(``tests/_netns.py``), find each other by mDNS and talk over real TCP with the
fleet's security.  Node 0 publishes :data:`COUNT` messages at :data:`RATE`
per second on one topic; the other five subscribe.  :data:`CUT_AFTER`
seconds after the first publication, the hosts of one side are moved to a
second bridge (the switch splits in two; each side still talks within
itself) and, :data:`CUT_FOR` seconds later, moved back.

What is measured (:func:`report`): when the publisher's view held every
subscriber again after the heal (the re-merge), how many nodes took a new
incarnation, and, per subscriber, how many of the publications made after
the re-merge it delivered.  What must hold (:func:`problems`): every node
exits 0 without a traceback; the traces keep causal order, FIFO and
exactly-once, and ``p2p check`` passes on them (validity against each
publication's view included); the fleet re-merges
within :data:`MERGE_BOUND` of the heal; every subscription made after the
heal is confirmed within that bound; every subscriber delivers every
publication made after the re-merge; and every publication made since a
subscriber's first delivery is delivered to it, on both sides: what it did
not get while the sides were apart, it resumes from the publisher's history
(1,000 publications by default, the split makes 500).

Run it by hand: ``python tests/_partition.py --side small`` (the publisher
on the small side) or ``--side large``; ``--runs N`` repeats it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _netns import Lan, ip, sigterm_raises, unavailable
from test_system_netns import NodeRun, Role, make_fleet, spawn_nodes

from p2p.sim import TraceEvent, check_trace, format_violations

NODES = 6
TOPIC = "chat"
COUNT = 1300
RATE = 20.0
SETTLE = 3.0
"""Seconds of discovery before the subscribers subscribe."""
PUBLISH_SETTLE = 6.0
"""Seconds before the publisher subscribes and starts publishing."""
CUT_AFTER = 10.0
CUT_FOR = 25.0
MERGE_BOUND = 15.0
"""Seconds after the heal by which the publisher's view must hold every
subscriber again: the detector's revival probes (every 2 rounds of 1 s),
a suspicion's refutation and a re-subscription's ACK wave, with room for a
loaded 2-core host."""
TAIL = 30.0
"""Seconds the nodes run after the last publication."""
SIDES = {"small": (0, 1), "large": (2, 3, 4)}
"""Which hosts move to the second bridge: with the publisher (node 0) on the
small side, or the publisher left on the large side."""


@dataclass(slots=True)
class PartitionRun:
    """What one run did: its nodes, the wall times of the cut and the heal, the trace."""

    nodes: list[NodeRun]
    side: tuple[int, ...]
    cut: float = 0.0
    heal: float = 0.0
    rows: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    trace: list[TraceEvent] = field(default_factory=list)
    load_problems: list[str] = field(default_factory=list)


def _argv(node: NodeRun, duration: float) -> list[str]:
    role = ["--publish", TOPIC, "--count", str(COUNT), "--rate", str(RATE)]
    if node.index:
        role = ["--subscribe", TOPIC, "--count", "0"]
    settle = PUBLISH_SETTLE if node.index == 0 else SETTLE
    return [
        sys.executable, "-m", "p2p", "node", "--identity", str(node.identity),
        "--interface", node.address, *role, "--duration", f"{duration:.1f}",
        "--trace", str(node.trace), "--settle", str(settle),
    ]  # fmt: skip


def _move(net: Lan, hosts: tuple[int, ...], bridge: str) -> None:
    for i in hosts:
        ip("-n", net.hub, "link", "set", f"p{net.suffix}n{i}", "master", bridge)


def run(net: Lan, root: Path, side: str, progress: bool = False) -> PartitionRun:
    """Make the fleet, start every node, cut and heal the LAN; load the traces."""
    nodes = make_fleet(root, [Role(TOPIC)] * NODES, psk=False)
    out = root / "out"
    out.mkdir()
    second = f"bs{net.suffix}"
    ip("-n", net.hub, "link", "add", second, "type", "bridge", "mcast_snooping", "0")
    ip("-n", net.hub, "link", "set", second, "up")
    duration = PUBLISH_SETTLE + COUNT / RATE + TAIL
    procs = spawn_nodes(net, nodes, out, lambda node: _argv(node, duration))
    pr = PartitionRun(nodes, SIDES[side])
    first = _first_publication(nodes[0], time.monotonic() + PUBLISH_SETTLE + 30)
    time.sleep(max(0.0, first + CUT_AFTER - time.time()))
    _move(net, pr.side, second)
    pr.cut = time.time()
    if progress:
        print(f"partition: cut {pr.side} off at {pr.cut - first:.1f} s", flush=True)
    time.sleep(CUT_FOR)
    _move(net, pr.side, net.bridge)
    pr.heal = time.time()
    if progress:
        print(f"partition: healed at {pr.heal - first:.1f} s", flush=True)
    for node, proc in zip(nodes, procs, strict=True):
        try:
            node.returncode = proc.wait(duration + 60)
        except Exception:
            pr.load_problems.append(f"node {node.index} outlived its --duration")
    _load(pr)
    return pr


def _first_publication(publisher: NodeRun, deadline: float) -> float:
    """Wall time of the publisher's first ``publish`` trace line."""
    while time.monotonic() < deadline:
        if publisher.trace.exists():
            for line in publisher.trace.read_text().splitlines():
                row = json.loads(line)
                if row["event"] == "publish":
                    return float(row["time"])
        time.sleep(0.1)
    raise AssertionError("the publisher published nothing")


def _load(pr: PartitionRun) -> None:
    """Every node's trace as checker events (a source is a node index)."""
    index = {n.node_id: n.index for n in pr.nodes}
    for n in pr.nodes:
        text = n.trace.read_text() if n.trace.exists() else ""
        pr.rows[n.index] = [
            json.loads(x) for x in text.splitlines(keepends=True) if x.endswith("\n")
        ]
        for row in pr.rows[n.index]:
            source = index.get(row["source"]) if row["source"] is not None else None
            pr.trace.append(
                TraceEvent(row["time"], n.index, row["event"], row["topic"], source, row["seq"])
            )


# ---------------------------------------------------------------- findings


def merged_at(pr: PartitionRun) -> float | None:
    """When, after the heal, the fleet was one again: from then on every
    publication's view (its ``publish`` trace line) holds every node, and
    every node's current life has its subscription confirmed (``None``: a
    view stayed short to the end, or some life never confirmed)."""
    merged: float | None = None
    for r in pr.rows[0]:
        if r["event"] == "publish" and r["time"] >= pr.heal:
            if len(r.get("view", ())) < NODES:
                merged = None
            elif merged is None:
                merged = float(r["time"])
    if merged is None:
        return None
    for rows in pr.rows.values():
        began = max((r["time"] for r in rows if r["event"] == "recover"), default=0.0)
        confirmed = [r["time"] for r in rows if r["event"] == "subscribed" and r["time"] >= began]
        if not confirmed:
            return None
        merged = max(merged, min(confirmed))
    return merged


def report(pr: PartitionRun) -> dict[str, Any]:
    """The run's figures: re-merge delay, new incarnations, deliveries after it."""
    merged = merged_at(pr)
    after = merged if merged is not None else pr.heal + MERGE_BOUND
    made = [e for e in pr.trace if e.event == "publish" and e.node == 0 and e.time > after]
    late = {(e.source, e.seq) for e in made}
    got: Counter[int] = Counter()
    whole: Counter[int] = Counter()
    for e in pr.trace:
        if e.event == "deliver" and e.source == 0 and e.node:
            whole[e.node] += 1
            got[e.node] += (e.source, e.seq) in late
    reinc = {n: sum(r["event"] == "recover" for r in rows) for n, rows in pr.rows.items()}
    missed: Counter[int] = Counter()
    for e in pr.trace:
        if e.event == "gap" and e.source == 0 and e.seq is not None:
            missed[e.node] += e.seq
    return {
        "side": list(pr.side),
        "merged_after_heal_s": None if merged is None else round(merged - pr.heal, 2),
        "new_incarnations": reinc,
        "nodes_reincarnated": sum(1 for v in reinc.values() if v),
        "published": sum(1 for e in pr.trace if e.event == "publish"),
        "published_after_merge": len(made),
        "delivered_after_merge": {n: got[n] for n in range(1, NODES)},
        "delivered_whole_run": {n: whole[n] for n in range(1, NODES)},
        "missed_whole_run": {n: missed[n] for n in range(1, NODES)},
        "owed_whole_run": {n: _owed(pr, n) for n in range(1, NODES)},
    }


def _owed(pr: PartitionRun, node: int) -> int:
    """The publisher's publications from the first ``node`` delivered on:
    each must be delivered or reported missed (a ``gap`` line), exactly."""
    made = [e.seq for e in pr.trace if e.event == "publish" and e.node == 0]
    got = {e.seq for e in pr.trace if e.event == "deliver" and e.node == node and e.source == 0}
    first = next((i for i, seq in enumerate(made) if seq in got), len(made))
    return len(made) - first


def problems(pr: PartitionRun) -> list[str]:
    """Every broken promise of the run (empty when all held)."""
    found = list(pr.load_problems)
    for n in pr.nodes:
        err = n.stderr.read_text(errors="replace") if n.stderr.exists() else ""
        if n.returncode != 0:
            found.append(f"node {n.index} exited {n.returncode}")
        if "Traceback" in err:
            found.append(f"node {n.index} logged a traceback")
    violations = check_trace(pr.trace)  # safety: liveness is judged below
    if violations:
        found.append(format_violations(violations))
    checked = subprocess.run(
        [sys.executable, "-m", "p2p", "check", *(str(n.trace) for n in pr.nodes)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if checked.returncode != 0:  # validity against each publication's view, too
        found.append("p2p check: " + checked.stdout[-2000:] + checked.stderr[-500:])
    merged = merged_at(pr)
    if merged is None or merged - pr.heal > MERGE_BOUND:
        found.append(f"not re-merged within {MERGE_BOUND} s of the heal (merged at {merged})")
    rep = report(pr)
    if rep["published_after_merge"] < 100:
        found.append(f"only {rep['published_after_merge']} publications after the re-merge")
    for node, owed in rep["owed_whole_run"].items():
        got, missed = rep["delivered_whole_run"][node], rep["missed_whole_run"][node]
        if got + missed != owed:
            found.append(
                f"node {node} delivered {got} and reported {missed} missed of the {owed} "
                "publications made since its first delivery"
            )
    for node, missed in rep["missed_whole_run"].items():
        if missed:  # the publisher's history (1000) holds the whole split (500)
            found.append(f"node {node} missed {missed} publications: the history covers the split")
    for node, got in rep["delivered_after_merge"].items():
        if got != rep["published_after_merge"]:
            found.append(
                f"node {node} delivered {got} of the {rep['published_after_merge']} "
                "publications made after the re-merge"
            )
    return found


def per_node_log(pr: PartitionRun) -> dict[int, list[str]]:
    """Membership lines of each node's stderr (for a failed run's report)."""
    keep = ("suspect", "incarnation", "answers again", "subscribed", "peers found")
    out: dict[int, list[str]] = defaultdict(list)
    for n in pr.nodes:
        text = n.stderr.read_text(errors="replace") if n.stderr.exists() else ""
        out[n.index] = [line for line in text.splitlines() if any(k in line for k in keep)]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--side", choices=sorted(SIDES), default="small")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--out", type=Path, help="write the reports (JSON) here")
    p.add_argument("--keep", type=Path, help="copy each run's logs and traces here")
    args = p.parse_args()
    reason = unavailable()
    if reason is not None:
        print(f"partition: {reason}", file=sys.stderr)
        return 2
    results = []
    for k in range(args.runs):
        with sigterm_raises(), tempfile.TemporaryDirectory() as tmp, Lan(NODES) as net:
            pr = run(net, Path(tmp), args.side, progress=True)
            result = {**report(pr), "problems": problems(pr)}
            if result["problems"]:
                result["log"] = per_node_log(pr)
            if args.keep:
                import shutil

                shutil.copytree(Path(tmp) / "out", args.keep / f"run{k}", dirs_exist_ok=True)
        results.append(result)
        print(json.dumps(result, indent=1), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 1 if any(r["problems"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

"""``p2p check TRACE...``: the simulator's trace checks on traces of real (or simulated) runs.

Checks, on the merged traces of many nodes: no duplicate delivery, nothing
invented, delivery only while subscribed, per-source FIFO, causal order per
topic, crashed nodes inert and, unless ``--safety-only``, validity and
agreement (every subscription confirmed before a publication delivers it;
see :mod:`p2p.sim._checks`).  Exit status: 0 when every check holds, 1 with
a report of the first violations, 2 when a file cannot be read or no file
holds an event.

Safety never compares clocks across nodes (happened-before comes from each
node's order of events and from publications).  Validity does: "confirmed
before the publication" compares the subscriber's and the publisher's
timestamps, so on devices whose clocks disagree by more than the time a
subscription takes to confirm, prefer ``--safety-only``.  The ``inert``
check also reads each node's own clock: an event stamped before the node's
previous one is reported, so a device whose wall clock stepped back during
the run shows up there.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from p2p._errors import P2PError
from p2p.sim._checks import KINDS, TraceChecker, Violation
from p2p.sim._tracefile import LoadedTraces, load_traces


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``check`` subcommand; its handler is :func:`cmd_check`."""
    p = sub.add_parser(
        "check",
        help="check TRACE.jsonl files (p2p node --trace, p2p sim --trace) for violations",
    )
    p.add_argument("traces", nargs="+", type=Path, metavar="TRACE", help="trace files, any order")
    p.add_argument(
        "--safety-only",
        action="store_true",
        help="skip validity/agreement (for traces of runs cut short)",
    )
    p.add_argument("--limit", type=int, default=10, help="violations to show (default 10)")


def check_files(
    paths: list[Path], *, liveness: bool = True
) -> tuple[LoadedTraces, list[Violation]]:
    """Load ``paths`` and run every check; raise :class:`P2PError` on unreadable input."""
    loaded = load_traces(paths)
    checker = TraceChecker()
    checker.feed(loaded.events)
    checker.close()
    return loaded, checker.violations(quiescent=liveness)


def report(loaded: LoadedTraces, found: list[Violation], *, limit: int) -> str:
    """A readable report: totals, then the first ``limit`` violations in trace order."""
    nodes = {e.node for e in loaded.events}
    pubs = sum(1 for e in loaded.events if e.event == "publish")
    dlv = sum(1 for e in loaded.events if e.event == "deliver")
    lines = [
        f"{loaded.files} file(s), {loaded.lines} events, {len(nodes)} nodes, "
        f"{pubs} publications, {dlv} deliveries"
    ]
    if not found:
        lines.append("OK: no violations")
        return "\n".join(lines)
    counts = Counter(v.kind for v in found)
    kinds = ", ".join(f"{k}: {counts[k]}" for k in KINDS if k in counts)
    lines.append(f"FAILED: {len(found)} violation(s) ({kinds}); first {min(limit, len(found))}:")
    lines.extend(f"  {v}" for v in found[:limit])
    if any(not label.isdecimal() for label in loaded.names.values()):
        shown = {v.node for v in found[:limit]}
        legend = ", ".join(f"{n}={loaded.name(n)}" for n in sorted(loaded.names) if n in shown)
        lines.append(f"nodes (also as message sources): {legend}")
    return "\n".join(lines)


def cmd_check(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise P2PError(f"--limit must be >= 0, got {args.limit}")
    loaded, found = check_files(args.traces, liveness=not args.safety_only)
    if not loaded.lines:
        # Every check holds vacuously on nothing: a pass here would hide a
        # node that never wrote its trace (a missing --trace, a wrong path).
        raise P2PError("no events in the given trace files: nothing to check")
    print(report(loaded, found, limit=args.limit))
    return 1 if found else 0


__all__ = ["add_parser", "check_files", "cmd_check", "report"]

"""Where the fan-out's latency comes from: the paced 1 -> 4 fan-out of
``bench.runtime`` at several rates, ours beside Zenoh's in the same run.

Run from the checkout's root (needs the ``bench`` extra)::

    python -m bench.latency_rates --out bench/results/latency_rates.json

Per rate and system: latency p50/p99 (every subscriber's samples pooled),
CPU per message at the publisher and at a subscriber, and the cores the five
processes used together.  For ours, every node's trace is written and each
subscriber's own latency (publish at the source to delivery there) is
reported, fastest first: the fastest is a child of the publisher, one hop.

At a rate far below what a round trip allows (100 msg/s against rounds that
take a few milliseconds) no publication ever waits behind a round in flight,
so the latency there is the path itself: its hops, each a decode, a step of
the node machine, a forward and a delivery.  A ``cpu_probe`` of a fixed loop
says how fast the host's CPU was during the run.

Beside them, two floors on the same tree (``bench._floor_worker``): our
rounds over trio and TCP with nothing else (``floor``: one round in flight,
cut-through, the ACK wave), and the same without rounds (``stream``: every
publication forwarded when due).  ``floor`` is the least any node built on
trio with one round in flight can reach on this host; the gap from ``floor``
to ``stream`` is what rounds themselves cost in latency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench._runtime_workers import FLOORS
from bench.runtime import (
    NODES,
    SYSTEMS,
    Bench,
    BenchError,
    Settings,
    fastest_first,
    use_bytecode_cache,
)


def cpu_probe(repeat: int = 50) -> float:
    """Microseconds of a fixed pure-Python loop, the median of ``repeat``: a
    figure of this host's speed during the run (lower is faster)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        total = 0
        for i in range(2000):
            total += i * i
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def _events(trace: Path, kind: str) -> dict[int, float]:
    """Per ``seq``, the time of the ``kind`` event (``publish``, ``deliver``) in one
    of our nodes' traces (``time event source seq`` lines)."""
    out: dict[int, float] = {}
    with open(trace, encoding="utf-8") as fh:
        for line in fh:
            t, event, _, seq = line.split()
            if event == kind and seq != "-":
                out[int(seq)] = float(t)
    return out


def hop_latency(workdir: Path, nodes: int) -> list[dict[str, float]]:
    """Per subscriber, publish (at node 0) to delivery there in ms, fastest first."""
    published = _events(workdir / "n0.trace", "publish")
    return fastest_first(
        [(t - published[q]) * 1000 for q, t in _events(workdir / f"n{i}.trace", "deliver").items()
         if q in published]
        for i in range(1, nodes)
    )  # fmt: skip


def depth(tree: dict[int, tuple[int, ...]], root: int = 0) -> int:
    """Hops from ``root`` to its farthest node in ``tree`` (``{node: children}``)."""
    return 1 + max((depth(tree, c) for c in tree[root]), default=-1)


def one_rate(bench: Bench, system: str, rate: float, seconds: float) -> dict[str, Any]:
    """The paced fan-out of ``system`` at ``rate`` for ``seconds`` (ours traced),
    on ``bench``'s fleet: every system and rate of a run use the same tree."""
    s = bench.s = replace(bench.s, latency_rate=rate, latency_s=seconds)
    workdir = bench.workdir / f"{system}-{rate:g}-{time.monotonic_ns()}"
    workdir.mkdir()
    traced = system == "ours"
    _, summary = bench.latency(system, idle=False, trace=workdir if traced else None)
    row: dict[str, Any] = {
        "system": system,
        "rate": rate,
        "latency_ms": summary["latency_ms"],
        "cpu_us_per_msg": summary["cpu_us_per_msg"],
        "cores": round(sum(summary["cpu_run_s"]) / (s.latency_s + s.warmup_s), 2),
        "undelivered": summary["undelivered"],
    }
    # Ours from the traces (publish at the source to delivery there), the
    # others from their payloads' send times.
    row["per_subscriber_ms"] = (
        hop_latency(workdir, NODES) if traced else summary["per_subscriber_ms"]
    )
    return row


def main(argv: Sequence[str] | None = None) -> int:
    """Run every rate for every system, print one line each, write the JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.latency_rates", description=__doc__)
    p.add_argument("--rates", default="100,250,500,1000", help="msg/s, comma-separated")
    p.add_argument(
        "--systems",
        default="ours,floor,stream,zenoh",
        help="comma-separated: ours, zenoh, zmq, and the floors (bench._floor_worker)",
    )
    p.add_argument("--seconds", type=float, default=5.0, help="seconds of publishing per run")
    p.add_argument("--out", type=Path, default=Path("bench/results/latency_rates.json"))
    args = p.parse_args(argv)
    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        print(f"--rates: not numbers: {args.rates!r}", file=sys.stderr)
        return 2
    if any(r <= 0 for r in rates):
        print("--rates must be above 0", file=sys.stderr)
        return 2
    systems = args.systems.split(",")
    if unknown := set(systems) - {*SYSTEMS, *FLOORS}:
        print(f"--systems: unknown {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    warmup = Settings().warmup_s
    if args.seconds <= warmup:  # the first warmup_s of publishing are not measured
        print(f"--seconds must be above the {warmup:g} s warm-up", file=sys.stderr)
        return 2
    rows = []
    probe_before = cpu_probe()
    with tempfile.TemporaryDirectory(prefix="latency-rates-") as tmp:
        use_bytecode_cache(Path(tmp) / "pycache")  # as bench.runtime: no compiling per worker
        bench = Bench(Settings(), Path(tmp), verbose=False)
        print(f"tree from node 0: {bench.tree}, depth {depth(bench.tree)}", flush=True)
        for rate in rates:
            for system in systems:
                try:
                    row = one_rate(bench, system, rate, args.seconds)
                except BenchError as exc:
                    print(f"{system} at {rate:g} msg/s failed: {exc}", file=sys.stderr)
                    return 1
                lat, cpu = row["latency_ms"], row["cpu_us_per_msg"]
                hops = " ".join(f"{h['p50']:.2f}" for h in row.get("per_subscriber_ms", []))
                print(
                    f"{system:<6} {rate:>6g} msg/s  p50 {lat['p50']:6.2f}  p99 {lat['p99']:6.2f} ms"
                    f"  CPU/msg pub {cpu['publisher']:7.0f} sub {cpu['subscriber']:7.0f} us"
                    f"  cores {row['cores']:.2f}"
                    + (f"  per-subscriber p50 {hops}" if hops else ""),
                    flush=True,
                )
                rows.append(row)
    doc = {
        "benchmark": "latency_rates",
        "tree": {str(k): v for k, v in bench.tree.items()},
        "cpu_probe_us": {"before": probe_before, "after": cpu_probe()},
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Why the simulator slows down with N: work per packet or memory per node?

A benchmark, not a test: it asserts nothing.  Run it from the repository root::

    python -m bench.sim_scaling            # about two minutes
    python -m bench.sim_scaling --quick    # about 20 s, smaller fleets

``bench.sim_speed`` finds 1024 nodes 1.4-1.9x slower per packet than 64
(issue 21).  Two things grow with N in its case ``b``: the work per packet
(every node publishes in the same 1,000 u.t., so more publications are
concurrent and causal barriers are longer) and the state each node keeps
(per-stream dicts of N entries, so the fleet's working set outgrows the CPU
caches).  This benchmark separates them:

``rate``        case ``a`` (every node subscribed by oracle, each publishing
                once) at N nodes, with the publication window stretched to
                ``1000 * N / 64`` u.t.: every node publishes at the rate of
                the 64-node baseline, so concurrency grows far less with N.
                Packets/s per N (the median of up to 5 runs), and each N
                against 64.
``interleave``  K independent 64-node runs of case ``a`` (seeds 0..K-1), one
                event at a time: first each run to its end (``sequential``),
                then all of them in turns (``interleaved``).  Both execute the
                same events with the same code; only the order in which the
                runs' states are touched differs.  The ratio is what a larger
                working set alone costs, without any change in work per packet.

Sequential and interleaved alternate (``--pairs``, 5 by default) in one
invocation, so the noise of a shared machine falls on both.  The table goes
to stdout, the numbers to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.sim_speed import PUB_WINDOW, Case, _machine, build_sim, cases, workload
from p2p.sim import Simulation

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "out" / "sim_scaling.json"
BASE_NODES = 64


def _baseline() -> Case:
    return next(c for c in cases(quick=False) if c.key == "a")


def _packets(sim: Simulation) -> int:
    return sum(sim.recorder.packets.values())


def _timed_rate(nodes: int, seed: int) -> dict[str, Any]:
    """One ``rate`` run: case ``a`` at ``nodes`` nodes, the window scaled with N."""
    case = dataclasses.replace(_baseline(), nodes=nodes, repeat=1)
    window = PUB_WINDOW * nodes / BASE_NODES
    sim = build_sim(case, seed, workload(case, seed, window))
    gc.collect()
    started = time.perf_counter()
    while sim.run(max_events=200_000):
        pass
    wall = time.perf_counter() - started
    packets = _packets(sim)
    return {"nodes": nodes, "window": window, "packets": packets, "run_s": wall,
            "packets_per_s": packets / wall}  # fmt: skip


def _step_all(sims: list[Simulation], interleaved: bool) -> float:
    """Run ``sims`` to their ends one event per call; return the wall time.

    The cyclic collector is off for both orders (``Simulation.run`` would
    switch it on and off around every single event otherwise)."""
    for sim in sims:
        sim.pause_gc = False
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        if interleaved:
            live = list(sims)
            while live:
                live = [s for s in live if s.run(max_events=1)]
        else:
            for sim in sims:
                while sim.run(max_events=1):
                    pass
        return time.perf_counter() - started
    finally:
        gc.enable()


def _timed_interleave(runs: int, interleaved: bool) -> dict[str, Any]:
    case = _baseline()
    sims = [build_sim(case, seed, workload(case, seed)) for seed in range(runs)]
    wall = _step_all(sims, interleaved)
    packets = sum(_packets(s) for s in sims)
    return {"order": "interleaved" if interleaved else "sequential", "runs": runs,
            "packets": packets, "run_s": wall, "packets_per_s": packets / wall}  # fmt: skip


def _rate_table(rows: list[dict[str, Any]]) -> list[str]:
    base = rows[0]["packets_per_s"]
    lines = [f"{'nodes':>6} {'window':>8} {'packets':>9} {'run s':>7} {'pkt/s':>8} {'64/N':>6}"]
    for r in rows:
        lines.append(
            f"{r['nodes']:>6} {r['window']:>8.0f} {r['packets']:>9} {r['run_s']:>7.2f} "
            f"{r['packets_per_s']:>8.0f} {base / r['packets_per_s']:>6.2f}"
        )
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.sim_scaling",
        description="Simulator slowdown with N: work per packet against memory per node.",
    )
    p.add_argument("--quick", action="store_true", help="smaller fleets (~20 s)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output ({DEFAULT_OUT})")
    p.add_argument("--seed", type=int, default=1, help="seed of the rate runs (default 1)")
    p.add_argument("--pairs", type=int, default=5, help="interleave pairs (default 5)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sizes = [64, 128, 256] if args.quick else [64, 256, 1024]
    runs = 4 if args.quick else 16
    started = time.perf_counter()
    load_before = os.getloadavg()
    _timed_rate(BASE_NODES, args.seed)  # warm-up: the first run pays for lazy imports
    rate = []
    for nodes in sizes:
        repeat = max(1, min(5, 1024 // nodes))
        print(f"  rate: {nodes} nodes, {repeat} run(s) ...", file=sys.stderr, flush=True)
        timed = sorted((_timed_rate(nodes, args.seed) for _ in range(repeat)),
                       key=lambda r: float(r["run_s"]))  # fmt: skip
        rate.append(timed[(repeat - 1) // 2])
    inter = []
    for interleaved in (False, True) * args.pairs:
        order = "interleaved" if interleaved else "sequential"
        print(f"  interleave: {runs} x {BASE_NODES} nodes, {order} ...", file=sys.stderr)
        inter.append(_timed_interleave(runs, interleaved))
    seq = statistics.median(r["packets_per_s"] for r in inter if r["order"] == "sequential")
    mixed = statistics.median(r["packets_per_s"] for r in inter if r["order"] == "interleaved")
    pairs = zip(inter[::2], inter[1::2], strict=True)
    pair_ratios = [a["packets_per_s"] / b["packets_per_s"] for a, b in pairs]
    print("\n".join(_rate_table(rate)))
    print(
        f"interleave ({runs} runs of {BASE_NODES} nodes): sequential {seq:.0f} pkt/s, "
        f"interleaved {mixed:.0f} pkt/s (medians of {args.pairs}), sequential/interleaved "
        f"{seq / mixed:.2f}; per pair {' '.join(f'{r:.2f}' for r in pair_ratios)}"
    )
    doc = {
        "benchmark": "sim_scaling",
        "quick": args.quick,
        "seed": args.seed,
        "total_s": time.perf_counter() - started,
        "machine": _machine(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "rate": rate,
        "interleave": inter,
        "sequential_over_interleaved": seq / mixed,
        "pair_ratios": pair_ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

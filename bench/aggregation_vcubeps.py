"""Timer-free aggregation inside VCube-PS: a hot topic, aggregation off / causal / on.

Every node subscribes (oracle start, no SUB traffic) and publishes one 50-byte
message at a uniform time in [0, 1000] u.t. (the §5.6.3 workload with 100 %
publishers), under the thesis' delay model.  For each size and seed the same
workload runs three times:

* ``off``: no aggregation (the thesis' VCube-PS);
* ``causal``: a round's packet is held from a child until the predecessors this
  node brings it are sent (barrier-based causal aggregation);
* ``on``: that plus link coalescing (the default).

Prints a table and writes ``bench/results/ch4-vcubeps.json``::

    python -m bench.aggregation_vcubeps                 # 16..512 nodes, 3 seeds (~6 min)
    python -m bench.aggregation_vcubeps --max-nodes 128 --seeds 1   # quick
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2p.sim import Simulation

MODES = ("off", "causal", "on")
OUT = Path(__file__).parent / "results" / "ch4-vcubeps.json"


def run_one(n: int, seed: int, mode: str) -> dict[str, Any]:
    """One run; the workload depends on ``(n, seed)`` only, not on ``mode``."""
    rng = random.Random(f"vcubeps-agg/{n}/{seed}")
    times = [rng.uniform(0.0, 1000.0) for _ in range(n)]
    sim = Simulation(list(range(n)), aggregation=mode, seed=seed, record_trace=False)
    sim.preset_subscriptions("hot", range(n))
    for node, t in enumerate(times):
        sim.schedule(t, "PUB", node, "hot", b"x" * 50)
    started = time.process_time()
    sim.run()
    cpu = time.process_time() - started
    m = sim.recorder.metrics()
    per_packet = sim.recorder.msgs_per_frame
    frames = sim.recorder.frames
    multi = sum(v for k, v in per_packet.items() if k > 1)
    pending = list(sim.recorder.pending_max.values())
    return {
        "n": n,
        "seed": seed,
        "mode": mode,
        "link_packets": frames,
        "protocol_packets": m["packets"],
        "bytes": m["link"]["bytes"],
        "pct_multi": 100.0 * multi / max(frames, 1),
        "held_back": m["link"]["held_back"],
        "mistaken_holds": sum(getattr(c, "mistaken_holds", 0) for c in sim.nodes.values()),
        "reception_mean": m["latency"]["reception"]["mean"],
        "delivery_mean": m["latency"]["delivery"]["mean"],
        "delivery_p99": m["latency"]["delivery"]["p99"],
        "deliveries": m["deliveries"],
        "pending_max_mean": statistics.fmean(pending) if pending else 0.0,
        "quiescent": sim.quiescent(),
        "cpu_s": cpu,
    }


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(float(r[key]) for r in rows)


def table(runs: list[dict[str, Any]]) -> str:
    """Means over seeds; reductions are against ``off`` of the same size."""
    lines = [
        "| N | mode | link packets | reduction | >1 msg | bytes | held | reception | delivery"
        " | delivery p99 |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({r["n"] for r in runs}):
        off = [r for r in runs if r["n"] == n and r["mode"] == "off"]
        for mode in MODES:
            rows = [r for r in runs if r["n"] == n and r["mode"] == mode]
            pkts = _mean(rows, "link_packets")
            red = 100.0 * (1 - pkts / _mean(off, "link_packets"))
            lines.append(
                f"| {n} | {mode} | {pkts:,.0f} | {red:.1f} % | {_mean(rows, 'pct_multi'):.1f} %"
                f" | {_mean(rows, 'bytes'):,.0f} | {_mean(rows, 'held_back'):,.0f}"
                f" | {_mean(rows, 'reception_mean'):.1f} | {_mean(rows, 'delivery_mean'):.1f}"
                f" | {_mean(rows, 'delivery_p99'):.1f} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-nodes", type=int, default=16)
    parser.add_argument("--max-nodes", type=int, default=512)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    sizes = []
    n = args.min_nodes
    while n <= args.max_nodes:
        sizes.append(n)
        n *= 2
    runs = []
    for n in sizes:
        for seed in range(1, args.seeds + 1):
            for mode in MODES:
                row = run_one(n, seed, mode)
                runs.append(row)
                print(
                    f"  N={n} seed={seed} {mode}: {row['link_packets']} link packets, "
                    f"delivery {row['delivery_mean']:.1f} u.t. [{row['cpu_s']:.1f} s cpu]",
                    file=sys.stderr,
                    flush=True,
                )
                if not row["quiescent"]:
                    print(f"  WARNING: N={n} seed={seed} {mode} did not quiesce", file=sys.stderr)
    print(table(runs))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": runs, "table": table(runs)}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

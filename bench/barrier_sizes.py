"""How many dependencies each reception checks, as the fleet grows.

A measurement, not a test: it runs the workload of ``bench.sim_speed``'s
cases ``a`` and ``b`` (every node subscribed by oracle, each publishing once
at a uniform time in 1,000 u.t.) at several sizes and counts the entries
``CausalBuffer.add`` is handed per received publication (its causal barrier,
its ops and its source's previous publication).  That per-dependency work is
what grows with N per packet in ``b``, which is why ``a/b`` stays above the
1.5 asked by issue 21 (docs/benchmarks.md).  Run it from the repository root::

    python -m bench.barrier_sizes                   # 64, 256 and 1024 nodes (~2 min)
    python -m bench.barrier_sizes --nodes 64,256 --out /tmp/b.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from bench.sim_speed import Case, build_sim, workload
from causal import CausalBuffer

DEFAULT_OUT = Path(__file__).resolve().parent / "out" / "barrier_sizes.json"


def measure(nodes: int, seed: int) -> dict[str, Any]:
    """Run the workload at ``nodes`` and count ``CausalBuffer.add``'s entries."""
    case = Case("a" if nodes == 64 else "b", "barrier sizes", nodes, 1.0, None, True)
    drawn = workload(case, seed)
    counts = [0, 0, 0]  # calls, entries, largest
    original = CausalBuffer.add

    def counting(
        self: CausalBuffer[Any], item: Any, deps: Collection[tuple[int, int, int]]
    ) -> bool:
        counts[0] += 1
        counts[1] += len(deps)
        counts[2] = max(counts[2], len(deps))
        return original(self, item, deps)

    started = time.perf_counter()
    CausalBuffer.add = counting  # type: ignore[method-assign]
    try:
        sim = build_sim(case, seed, drawn)
        sim.run()
    finally:
        CausalBuffer.add = original  # type: ignore[method-assign]
    calls, entries, largest = counts
    return {
        "nodes": nodes,
        "receptions": calls,
        "entries": entries,
        "entries_per_reception": round(entries / calls, 2) if calls else 0.0,
        "largest": largest,
        "packets": sum(sim.recorder.packets.values()),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="64,256,1024", help="sizes, comma-separated")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    try:
        sizes = [int(n) for n in args.nodes.split(",")]
    except ValueError:
        parser.error(f"--nodes takes integers, got {args.nodes!r}")
    if any(n < 2 for n in sizes):
        parser.error("--nodes: every size must be at least 2")
    rows = []
    for n in sizes:
        print(f"running {n} nodes ...", file=sys.stderr, flush=True)
        row = measure(n, args.seed)
        rows.append(row)
        print(
            f"{n:>6} nodes: {row['entries_per_reception']:>6} entries per reception "
            f"(largest {row['largest']}), {row['receptions']:,} receptions, {row['wall_s']} s"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"seed": args.seed, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

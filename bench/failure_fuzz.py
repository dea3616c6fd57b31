"""Random crash scenarios in the simulator: how often does a guarantee break?

Not a test (it asserts nothing): a measurement of where the failure handling
stands, and a finder of minimal failing scripts to work on.  Each run draws,
from its seed, 3..10 nodes, one or two topics, a detection delay and a timed
script of SUB/UNS/PUB plus CRASH (and, in the ``recover`` mode, RECOVER),
runs it to quiescence and checks every trace invariant, liveness and the
views (the same checks as ``tests/test_failures.py``).  Run it from the
repository root::

    python -m bench.failure_fuzz                 # 400 runs per mode
    python -m bench.failure_fuzz --runs 50 --out /tmp/f.json
    python -m bench.failure_fuzz --first-seed 400 --runs 400 --tpp-stdev 60

``--tpp-stdev`` widens the spread of link delays (default 25, the thesis'),
which makes packets land inside a node's processing window at its crash more
often (the case issue 21 reported was found with 60).

It prints, per mode, how many runs broke something, by kind, and the
shortest failing script (replay it with its seed); the JSON has it all.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2p.sim import DelayModel, Script, Simulation, check_trace, check_views, legal_script

DETECT = [(200.0, 100.0), (1000.0, 500.0), (3000.0, 3000.0)]


def draw_script(rng: random.Random, n: int, topics: list[str], *, recover: bool) -> Script:
    """Random steps made legal by :func:`p2p.sim.legal_script` (crash on roll 9 while
    fewer than half the nodes are down)."""
    steps = [
        (round(rng.uniform(0, 6000), 1), rng.randrange(n), rng.choice(topics), rng.randint(0, 9))
        for _ in range(rng.randint(2 * n, 6 * n))
    ]
    return legal_script(steps, crash_roll=9, max_down=n // 2, recover=recover)


def run_one(seed: int, *, recover: bool, tpp_stdev: float = 25.0) -> dict[str, Any]:
    """Draw and run case ``seed``; return its script and what broke (kinds)."""
    rng = random.Random(seed)
    n = rng.randint(3, 10)
    topics = ["t0", "t1"][: rng.randint(1, 2)]
    detect = rng.choice(DETECT)
    script = draw_script(rng, n, topics, recover=recover)
    sim = Simulation(
        list(range(n)),
        seed=seed,
        detect_delay=detect[0],
        detect_jitter=detect[1],
        delays=DelayModel(tpp_stdev=tpp_stdev),
    )
    for at, action, node, topic in script:
        sim.schedule(at, action, node, topic, f"{node}@{at}".encode())
    kinds: list[str]
    try:
        sim.run()
        if not sim.quiescent():
            kinds = ["not-quiescent"]
        else:
            found = check_trace(sim.recorder.trace, quiescent=True) + check_views(sim)
            kinds = sorted({v.kind for v in found})
    except Exception as exc:  # a crash of a core is a finding too
        kinds = [f"exception:{type(exc).__name__}"]
    return {"seed": seed, "nodes": n, "detect": detect, "script": script, "broke": kinds}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="runs per mode (default 400)")
    parser.add_argument("--first-seed", type=int, default=0, help="seed of the first run")
    parser.add_argument("--tpp-stdev", type=float, default=25.0, help="stdev of t_pp (25)")
    parser.add_argument("--out", type=Path, default=Path("bench/out/failure_fuzz.json"))
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    result: dict[str, Any] = {}
    for mode, recover in (("crash", False), ("recover", True)):
        started = time.monotonic()
        seeds = range(args.first_seed, args.first_seed + args.runs)
        runs = [run_one(seed, recover=recover, tpp_stdev=args.tpp_stdev) for seed in seeds]
        bad = [r for r in runs if r["broke"]]
        kinds = Counter(k for r in bad for k in r["broke"])
        shortest = min(bad, key=lambda r: len(r["script"]), default=None)
        result[mode] = {
            "runs": args.runs,
            "first_seed": args.first_seed,
            "tpp_stdev": args.tpp_stdev,
            "broken": len(bad),
            "kinds": dict(kinds),
            "seconds": round(time.monotonic() - started, 1),
            "shortest": shortest,
        }
        print(f"{mode:>8}: {len(bad)}/{args.runs} runs broke a guarantee {dict(kinds)}")
        if shortest is not None:
            print(f"          shortest (seed {shortest['seed']}): {shortest['script']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

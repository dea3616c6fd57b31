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
    python -m bench.failure_fuzz --modes partial --runs 1000
    python -m bench.failure_fuzz --modes burst --runs 1000 --tpp-stdev 60
    python -m bench.failure_fuzz --modes partial --max-nodes 16 --runs 500

``--tpp-stdev`` widens the spread of link delays (default 25, the thesis'),
which makes packets land inside a node's processing window at its crash more
often (the case issue 21 reported was found with 60).

``--max-nodes`` raises the largest fleet drawn (default 10; the smallest is
3, and 5 in ``burst``): the same seed draws the same script shape with the
default, so the seeds in the tests keep their meaning.

``--modes`` picks the modes (default ``crash,recover``).  A third one,
``partial``, is the shape of ``tests/test_sim_detector.py``'s one-way
property at fuzz speed: crashes and recoveries with the real failure
detector instead of the oracle, every node started knowing only node 0 (plus
a few random introductions), node 0 never crashing; it also requires every
node that is up to end agreeing on who is up.  A fourth, ``burst``
(:func:`draw_burst`), crashes publishers right after they publish, so that
a crashed source's last round often dies with all its holders.

It prints, per mode, how many runs broke something, by kind, how many sent
FENCE packets (an agreement on where a crashed stream ends,
``topics._fence``), every failing seed (replay one with :func:`run_one`) and
the shortest failing script; the JSON has it all.  A mode that runs longer
than a few seconds reports its progress on stderr.
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
from vcube import DetectorConfig

DETECT = [(200.0, 100.0), (1000.0, 500.0), (3000.0, 3000.0)]
DETECTOR = DetectorConfig(interval=200.0, timeout=300.0, attempts=2, max_timeout=2400.0)
"""The real detector of ``partial`` runs (``tests/test_sim_detector.py``'s ``FAST``)."""
MODES = ("crash", "recover", "partial", "burst")


def draw_script(
    rng: random.Random, n: int, topics: list[str], *, recover: bool, keep: int | None = None
) -> Script:
    """Random steps made legal by :func:`p2p.sim.legal_script` (crash on roll 9 while
    fewer than half the nodes are down); node ``keep``, if given, never crashes."""
    steps = [
        (round(rng.uniform(0, 6000), 1), rng.randrange(n), rng.choice(topics), rng.randint(0, 9))
        for _ in range(rng.randint(2 * n, 6 * n))
    ]
    if keep is not None:
        steps = [(t, node, topic, 8 if node == keep and roll == 9 else roll)
                 for t, node, topic, roll in steps]  # fmt: skip
    return legal_script(steps, crash_roll=9, max_down=n // 2, recover=recover)


def draw_burst(rng: random.Random, max_nodes: int = 12) -> tuple[int, Script]:
    """``burst`` mode: 5..12 nodes subscribed to one topic from the start, then
    publications and crashes close together (a publisher often crashes
    within 90 u.t. of its publication, with its round still on its way), so
    that the holders of a round often crash before anyone hears of its
    source's crash: the shape the fence (``topics._fence``) is for."""
    n = rng.randint(5, max(5, max_nodes))
    script: Script = [(0.0, "SUB", k, "t0") for k in range(n)]
    down: set[int] = set()
    at = 1000.0
    for _ in range(rng.randint(3, 2 * n)):
        at += rng.expovariate(1 / 40.0)
        node = rng.choice([k for k in range(n) if k not in down])
        if rng.random() < 0.45 and len(down) < n - 2:
            down.add(node)
            script.append((round(at, 1), "CRASH", node, ""))
            continue
        script.append((round(at, 1), "PUB", node, "t0"))
        if rng.random() < 0.6 and len(down) < n - 2:
            down.add(node)
            script.append((round(at + rng.uniform(0, 90), 1), "CRASH", node, ""))
    return n, script


def run_one(
    seed: int,
    *,
    recover: bool,
    tpp_stdev: float = 25.0,
    partial: bool = False,
    burst: bool = False,
    detect: tuple[float, float] | None = None,
    max_nodes: int = 10,
) -> dict[str, Any]:
    """Draw and run case ``seed``; return its script and what broke (kinds).
    ``partial``: the real detector and seed-only introductions; ``burst``:
    :func:`draw_burst` (module docstring); ``detect``: the oracle's
    ``(delay, jitter)`` for every run instead of one drawn from :data:`DETECT`;
    ``max_nodes``: the largest fleet drawn (``burst``: 12 unless larger)."""
    rng = random.Random(seed)
    n = rng.randint(3, max_nodes)
    topics = ["t0", "t1"][: rng.randint(1, 2)]
    detect = rng.choice(DETECT if detect is None else [detect])
    delays = DelayModel(tpp_stdev=tpp_stdev)
    intro: dict[int, set[int]] | None = None
    if partial:
        intro = {k: {0} for k in range(1, n)}
        for _ in range(rng.randint(0, n)):
            intro.setdefault(rng.randrange(n), set()).add(rng.randrange(n))
        script = draw_script(rng, n, topics, recover=True, keep=0)
        sim = Simulation(
            list(range(n)), seed=seed, detector=DETECTOR, introductions=intro, delays=delays
        )
    else:
        if burst:
            n, script = draw_burst(rng, max(12, max_nodes))
        else:
            script = draw_script(rng, n, topics, recover=recover)
        sim = Simulation(
            list(range(n)),
            seed=seed,
            detect_delay=detect[0],
            detect_jitter=detect[1],
            delays=delays,
        )
    for at, action, node, topic in script:
        sim.schedule(at, action, node, topic, f"{node}@{at}".encode())
    found = {"seed": seed, "nodes": n, "script": script, "broke": _check(sim, partial)}
    found["fence_packets"] = sim.recorder.packets.get("FENCE", 0)  # topics._fence at work
    if partial:
        found["introductions"] = {k: sorted(v) for k, v in sorted(intro.items())} if intro else {}
        # link packets that reached a reincarnated node's new core (Simulation._same_process)
        found["older_life_packets"] = sim.membership_metrics().get("older_life_packets", 0)
    else:
        found["detect"] = detect
    return found


def _check(sim: Simulation, partial: bool) -> list[str]:
    """Run ``sim`` to its end; the kinds of what broke (empty if nothing)."""
    try:
        sim.run()
        if not sim.quiescent():
            return ["not-quiescent"]
        found = check_trace(sim.recorder.trace, quiescent=True) + check_views(sim)
        kinds = {v.kind for v in found}
        if partial:
            m = sim.membership_metrics()
            if not (m["converged"] and m["agreed"]):
                kinds.add("membership")
        return sorted(kinds)
    except Exception as exc:  # a crash of a core is a finding too
        return [f"exception:{type(exc).__name__}"]


def _detect_arg(text: str) -> tuple[float, float]:
    """``--detect DELAY,JITTER``: two finite numbers, the delay positive."""
    try:
        delay, jitter = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected DELAY,JITTER, got {text!r}") from None
    if not (0 < delay < float("inf") and 0 <= jitter < float("inf")):
        raise argparse.ArgumentTypeError(f"need DELAY > 0 and JITTER >= 0, got {text!r}")
    return delay, jitter


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="runs per mode (default 400)")
    parser.add_argument("--first-seed", type=int, default=0, help="seed of the first run")
    parser.add_argument("--tpp-stdev", type=float, default=25.0, help="stdev of t_pp (25)")
    parser.add_argument("--modes", default="crash,recover", help="of crash,recover,partial,burst")
    parser.add_argument(
        "--detect",
        type=_detect_arg,
        help="DELAY,JITTER of the oracle detector in every run (default: drawn per run)",
    )
    parser.add_argument(
        "--max-nodes", type=int, default=10, help="largest fleet drawn (default 10)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/out/failure_fuzz.json"))
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    if not 3 <= args.max_nodes <= 64:
        parser.error(f"--max-nodes takes 3..64, got {args.max_nodes}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes some of {','.join(MODES)}, got {args.modes!r}")
    result: dict[str, Any] = {}
    for mode in modes:
        started = time.monotonic()
        seeds = range(args.first_seed, args.first_seed + args.runs)
        runs = []
        shown = started
        for seed in seeds:
            runs.append(
                run_one(
                    seed,
                    recover=mode != "crash",
                    tpp_stdev=args.tpp_stdev,
                    partial=mode == "partial",
                    burst=mode == "burst",
                    detect=args.detect,
                    max_nodes=args.max_nodes,
                )
            )
            if time.monotonic() - shown > 30:
                shown = time.monotonic()
                broke = sum(1 for r in runs if r["broke"])
                print(f"{mode}: {len(runs)}/{args.runs} runs, {broke} broke", file=sys.stderr)
        bad = [r for r in runs if r["broke"]]
        kinds = Counter(k for r in bad for k in r["broke"])
        shortest = min(bad, key=lambda r: len(r["script"]), default=None)
        result[mode] = {
            "runs": args.runs,
            "first_seed": args.first_seed,
            "tpp_stdev": args.tpp_stdev,
            "detect": args.detect,
            "max_nodes": args.max_nodes,
            "broken": len(bad),
            "seeds": [r["seed"] for r in bad],
            "kinds": dict(kinds),
            "fenced": sum(1 for r in runs if r["fence_packets"]),
            "seconds": round(time.monotonic() - started, 1),
            "shortest": shortest,
        }
        fenced = result[mode]["fenced"]
        print(
            f"{mode:>8}: {len(bad)}/{args.runs} runs broke a guarantee {dict(kinds)}"
            f" ({fenced} needed the fence)"
        )
        if shortest is not None:
            print(f"          seeds: {' '.join(str(r['seed']) for r in bad)}")
            print(f"          shortest (seed {shortest['seed']}): {shortest['script']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

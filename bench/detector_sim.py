"""VCube failure detector in simulation: detection latency, tests, traffic, false suspicions.

A benchmark, not a test: it asserts nothing.  Run it from the repository root::

    python -m bench.detector_sim             # full run (N = 8 .. 1024, several seeds)
    python -m bench.detector_sim --quick     # smoke run (N = 8 .. 64, 2 seeds)
    python -m bench.detector_sim --out /tmp/x.json --jobs 2

Every run is :mod:`p2p.sim._detsim` (the same driver as ``tests/test_detector.py``):
random 64-bit ids, every node joined to every other, ticks every
``interval = 1 s`` at a random phase, ``timeout = 1 s`` (the runtime's
default; probes expire at their deadline, as in the runtime, so each attempt
waits one interval, as it did when probes sent at ticks with ``timeout =
0.5 s`` expired at the next tick), changes pushed down the broadcast trees,
one-way delays ``1 ms + Exp(mean 10 ms)``, no loss.  Per ``(N, seed)``:

``crash``  one random node crashes after 8 rounds: rounds until each correct
           node suspects it (median over the N-1 observers and max, against
           the published bound ``ceil(log2 N)^2``); probes and checks per round
           in steady state (rounds 2..7), against ``N log2 N`` and against
           ``T`` (the non-empty (node, cluster) pairs); probe+reply messages and
           bytes per node per second on idle links (rounds 2..7).
``mass``   10 % of the nodes (at least one) crash at once: the same latency.
``data``   as ``crash``, but every node also sends one data frame per round on
           each link it monitors, carrying its detector version (the driver's
           piggyback): probe+reply traffic, plus the piggybacked bytes.
``spike``  no crash, 1 % of messages delayed by 1.5 s (above one timeout,
           below two), 40 rounds (12 rounds and one seed for N > 256: every
           false suspicion and its correction reach every node, which is slow
           to simulate): timeouts of live nodes, suspicion events about live nodes (each timeout
           spreads), self-suspicions (nodes told they were suspected: under the
           library's rule each restarts with a new incarnation), and the
           detector traffic this churn costs.
``crash2``, ``spike2``  ``crash`` and ``spike`` with ``attempts = 2`` (two
           unanswered probes in a row before a suspicion).
``hint2``  ``crash2`` with the transport's hint 50 ms after the crash
           (``Detector.probe_now`` at every node linked to the crashed one).
``pull2``  ``crash2`` without pushes and with expiry at ticks only: the
           detector before pushes, for comparison within one run.

Probe+reply+push traffic counts in ``msgs``/``bytes``; ``push_msgs_per_node``
is every push sent in a crash run (its own and forwarded), per node.

Prints a table, writes JSON to ``bench/results/detector_sim.json`` (or ``--out``),
progress on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import ROOT, execute, machine
from p2p.sim._detsim import (
    CrashOutcome,
    Delays,
    DetectorNet,
    nonempty_clusters,
    run_crash,
    sparse_ids,
)
from vcube import DetectorConfig

DEFAULT_OUT = ROOT / "bench" / "results" / "detector_sim.json"
CONFIG = DetectorConfig(interval=1.0, timeout=1.0)
CONFIG2 = DetectorConfig(interval=1.0, timeout=1.0, attempts=2)
DELAYS = Delays(low=0.001, high=0.011, exponential=True)
SPIKES = Delays(low=0.001, high=0.011, exponential=True, spike_prob=0.01, spike=1.5)
WARMUP = 8
STEADY = range(2, WARMUP)
SPIKE_ROUNDS = 40
SPIKE_ROUNDS_LARGE = 12
LARGE = 256
SCENARIOS = ("crash", "mass", "data", "spike", "crash2", "spike2", "hint2", "pull2")
HINT_DELAY = 0.05
DETECTOR_KINDS = ("probe", "reply", "push")


@dataclass(frozen=True, slots=True)
class Task:
    """One simulation: a scenario for ``n`` nodes and a seed."""

    scenario: str
    n: int
    seed: int

    def cost(self) -> float:
        return self.n**2 * (3.0 if self.scenario.startswith("spike") else 1.0)

    def label(self) -> str:
        return f"{self.scenario} N={self.n} seed={self.seed}"


def per_node_second(counter: dict[tuple[str, int], int], kinds: tuple[str, ...], n: int) -> float:
    """Mean over the steady rounds of ``counter`` for ``kinds``, per node and second."""
    total = sum(counter.get((k, r), 0) for k in kinds for r in STEADY)
    return total / (n * len(STEADY) * CONFIG.interval)


def latency(out: CrashOutcome, net: DetectorNet) -> dict[str, Any]:
    """Median and max rounds until the correct nodes suspect the crashed ones."""
    lat = out.latencies
    pushes = sum(v for (k, _), v in net.record.messages.items() if k == "push")
    return {
        "push_msgs_per_node": pushes / out.n,
        "complete": out.complete,
        "median_rounds": statistics.median(lat) if lat else None,
        "max_rounds": max(lat) if lat else None,
        "worst_rounds_ceil": out.worst_rounds,
        "crashed": len(out.crashed),
    }


def traffic(net: DetectorNet, n: int) -> dict[str, Any]:
    """Steady-state probes/checks per round and traffic per node and second."""
    rec = net.record
    return {
        "probes_per_round": statistics.fmean(rec.probes[r] for r in STEADY),
        "checks_per_round": statistics.fmean(rec.checks[r] for r in STEADY),
        "max_probes_per_round": max(rec.probes.values()),
        "msgs_per_node_s": per_node_second(dict(rec.messages), DETECTOR_KINDS, n),
        "bytes_per_node_s": per_node_second(dict(rec.bytes), DETECTOR_KINDS, n),
        "piggyback_bytes_per_node_s": per_node_second(dict(rec.bytes), ("data",), n),
        "data_frames_per_node_s": per_node_second(dict(rec.messages), ("data",), n),
    }


def run(task: Task) -> dict[str, Any]:
    """One simulation; module-level so the process pool can pickle it."""
    started = time.perf_counter()
    rng = random.Random(f"{task.scenario}-{task.n}-{task.seed}")
    ids = sparse_ids(rng, task.n)
    res: dict[str, Any] = {"scenario": task.scenario, "n": task.n, "seed": task.seed}
    res["T"] = nonempty_clusters(ids)
    config = CONFIG2 if task.scenario.endswith("2") else CONFIG
    if task.scenario.startswith("spike"):
        res.update(spike(ids, rng, config))
    else:
        k = max(1, task.n // 10) if task.scenario == "mass" else 1
        dead = rng.sample(ids, k)
        pull = task.scenario == "pull2"
        out, net = run_crash(
            ids,
            dead,
            rng,
            config=dataclasses.replace(config, push=False) if pull else config,
            delays=DELAYS,
            data=task.scenario == "data",
            warmup=WARMUP,
            deadline_expiry=not pull,
            hint=HINT_DELAY if task.scenario == "hint2" else None,
        )
        res.update(latency(out, net))
        res.update(traffic(net, task.n))
        res["false_suspicions"] = out.false_suspicions
    res["wall_s"] = time.perf_counter() - started
    return res


def spike(ids: list[int], rng: random.Random, config: DetectorConfig) -> dict[str, Any]:
    """Delay spikes, no crash: how often live nodes get suspected."""
    rounds = SPIKE_ROUNDS if len(ids) <= LARGE else SPIKE_ROUNDS_LARGE
    net = DetectorNet(ids, rng, config=config, delays=SPIKES)
    net.run_until(rounds * CONFIG.interval)
    timeouts = sum(d.stats.timeouts for d in net.detectors.values())
    node_s = len(ids) * rounds * CONFIG.interval
    node_hours = node_s / 3600
    rec = net.record
    return {
        "rounds": rounds,
        "msgs_per_node_s": sum(v for (k, _), v in rec.messages.items() if k != "data") / node_s,
        "bytes_per_node_s": sum(v for (k, _), v in rec.bytes.items() if k != "data") / node_s,
        "timeouts": timeouts,
        "suspicion_events": len(net.record.false_suspicions),
        "corrections": net.record.corrections,
        "self_suspicions": net.record.self_suspicions,
        "self_suspicions_per_node_hour": net.record.self_suspicions / node_hours,
        "suspected_at_end": sum(len(d.suspected()) for d in net.detectors.values()),
    }


# ------------------------------------------------------------------ report --


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per N: medians/maxima over seeds of the per-run numbers."""
    rows = []
    for n in sorted({r["n"] for r in results}):
        by = {s: [r for r in results if r["n"] == n and r["scenario"] == s] for s in SCENARIOS}
        log_n = math.log2(n)
        crash, mass, data, spikes = by["crash"], by["mass"], by["data"], by["spike"]
        crash2, spikes2, hint2, pull2 = by["crash2"], by["spike2"], by["hint2"], by["pull2"]
        row: dict[str, Any] = {"n": n, "bound_rounds": math.ceil(log_n) ** 2, "n_log2_n": n * log_n}
        row["seeds"] = len(crash)
        row["T"] = statistics.fmean(r["T"] for r in crash)
        row["crash_median_rounds"] = statistics.median(r["median_rounds"] for r in crash)
        row["crash_max_rounds"] = max(r["max_rounds"] for r in crash)
        row["crash2_median_rounds"] = statistics.median(r["median_rounds"] for r in crash2)
        row["crash2_max_rounds"] = max(r["max_rounds"] for r in crash2)
        row["hint2_median_rounds"] = statistics.median(r["median_rounds"] for r in hint2)
        row["hint2_max_rounds"] = max(r["max_rounds"] for r in hint2)
        row["pull2_median_rounds"] = statistics.median(r["median_rounds"] for r in pull2)
        row["pull2_max_rounds"] = max(r["max_rounds"] for r in pull2)
        row["mass_median_rounds"] = statistics.median(r["median_rounds"] for r in mass)
        row["mass_max_rounds"] = max(r["max_rounds"] for r in mass)
        row["all_complete"] = all(
            r["complete"] for r in crash + mass + data + crash2 + hint2 + pull2
        )
        row["push_msgs_per_node_per_crash"] = statistics.fmean(
            r["push_msgs_per_node"] for r in crash
        )
        row["probes_per_round"] = statistics.fmean(r["probes_per_round"] for r in crash)
        row["checks_per_round"] = statistics.fmean(r["checks_per_round"] for r in crash)
        row["max_probes_per_round"] = max(r["max_probes_per_round"] for r in crash + mass)
        for key in ("msgs_per_node_s", "bytes_per_node_s"):
            row[f"idle_{key}"] = statistics.fmean(r[key] for r in crash)
            row[f"data_{key}"] = statistics.fmean(r[key] for r in data)
        row["data_piggyback_bytes_per_node_s"] = statistics.fmean(
            r["piggyback_bytes_per_node_s"] for r in data
        )
        row["false_suspicions_no_spikes"] = sum(
            r["false_suspicions"] for r in crash + mass + data + crash2 + hint2 + pull2
        )
        row["spike_timeouts"] = sum(r["timeouts"] for r in spikes)
        row["spike_self_suspicions_per_node_hour"] = statistics.fmean(
            r["self_suspicions_per_node_hour"] for r in spikes
        )
        row["spike_bytes_per_node_s"] = statistics.fmean(r["bytes_per_node_s"] for r in spikes)
        row["spike2_self_suspicions_per_node_hour"] = statistics.fmean(
            r["self_suspicions_per_node_hour"] for r in spikes2
        )
        row["spike2_bytes_per_node_s"] = statistics.fmean(r["bytes_per_node_s"] for r in spikes2)
        rows.append(row)
    return rows


COLUMNS = [
    ("N", "n", "{:d}"),
    ("bound", "bound_rounds", "{:d}"),
    ("lat med", "crash_median_rounds", "{:.2f}"),
    ("lat max", "crash_max_rounds", "{:.2f}"),
    ("a=2 med", "crash2_median_rounds", "{:.2f}"),
    ("a=2 max", "crash2_max_rounds", "{:.2f}"),
    ("hint med", "hint2_median_rounds", "{:.2f}"),
    ("hint max", "hint2_max_rounds", "{:.2f}"),
    ("pull med", "pull2_median_rounds", "{:.2f}"),
    ("pull max", "pull2_max_rounds", "{:.2f}"),
    ("10% med", "mass_median_rounds", "{:.2f}"),
    ("10% max", "mass_max_rounds", "{:.2f}"),
    ("N log2 N", "n_log2_n", "{:.0f}"),
    ("T", "T", "{:.0f}"),
    ("checks/rd", "checks_per_round", "{:.0f}"),
    ("probes/rd", "probes_per_round", "{:.0f}"),
    ("max pr/rd", "max_probes_per_round", "{:d}"),
    ("push/n/crash", "push_msgs_per_node_per_crash", "{:.2f}"),
    ("idle msg/n/s", "idle_msgs_per_node_s", "{:.1f}"),
    ("idle B/n/s", "idle_bytes_per_node_s", "{:.0f}"),
    ("data msg/n/s", "data_msgs_per_node_s", "{:.2f}"),
    ("data B/n/s", "data_bytes_per_node_s", "{:.1f}"),
    ("pgbk B/n/s", "data_piggyback_bytes_per_node_s", "{:.1f}"),
    ("spike selfsusp/n/h", "spike_self_suspicions_per_node_hour", "{:.0f}"),
    ("spike B/n/s", "spike_bytes_per_node_s", "{:.0f}"),
    ("a=2 selfsusp/n/h", "spike2_self_suspicions_per_node_hour", "{:.1f}"),
    ("a=2 B/n/s", "spike2_bytes_per_node_s", "{:.0f}"),
]


def table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of the summary rows."""
    cells = [[h for h, _, _ in COLUMNS]]
    cells += [[fmt.format(row[key]) for _, key, fmt in COLUMNS] for row in rows]
    widths = [max(len(r[c]) for r in cells) for c in range(len(COLUMNS))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 8..64, 2 seeds")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per N (default 5, quick 2)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    sizes = [8, 16, 32, 64] if args.quick else [8, 16, 32, 64, 128, 256, 512, 1024]
    seeds = args.seeds or (2 if args.quick else 5)
    tasks = [
        Task(s, n, seed)
        for n in sizes
        for seed in range(seeds if n <= 256 else max(1, (seeds + 1) // 2))
        for s in SCENARIOS
        if not s.startswith("spike") or n <= LARGE or seed == 0
    ]
    host = machine()
    started = time.perf_counter()
    results = execute(tasks, args.jobs, run)
    rows = summarize(results)
    print(table(rows))
    doc = {
        "benchmark": "detector_sim",
        "quick": args.quick,
        "config": {
            "interval": CONFIG.interval,
            "timeout": CONFIG.timeout,
            "attempts": [1, 2],
            "push": CONFIG.push,
            "expiry": "at deadlines (pull2: at ticks, no push)",
            "hint_delay_s": HINT_DELAY,
        },
        "delays": "1 ms + Exp(mean 10 ms) one way, no loss",
        "spikes": {"prob": SPIKES.spike_prob, "delay_s": SPIKES.spike},
        "warmup_rounds": WARMUP,
        "steady_rounds": [STEADY.start, STEADY.stop - 1],
        "machine": host,
        "wall_s": time.perf_counter() - started,
        "summary": rows,
        "runs": sorted(results, key=lambda r: (r["n"], r["scenario"], r["seed"])),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

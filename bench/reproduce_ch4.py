"""Rerun the causal-aggregation experiments of thesis §4.5 (de Araujo 2019).

Run it from the repository root::

    python -m bench.reproduce_ch4 --jobs 2          # main run + start-time sweep
    python -m bench.reproduce_ch4 --quick           # smoke run, well under a minute
    python -m bench.reproduce_ch4 --only main --min-nodes 1024 --max-nodes 1024 \
        --out bench/results/ch4-1024.json
    python -m bench.reproduce_ch4 --report bench/results/ch4.json \
        bench/results/ch4-1024.json                 # tables of saved runs, merged

Every node of an ``N``-node system broadcasts one 50-byte message with
``protocol="causal-broadcast"`` (one spanning tree per source on the VCube), under
the thesis' delay model (§4.5.1): ``t_pc = t_t = 1`` u.t., per-packet
``t_pp ~ Normal(100, 25)``, 20-byte packet header, 1500-byte MTU.  Each point is
run in three modes on the same start times (the scenario RNG is named by N, seed
and start model, so the modes are paired and ``--jobs`` does not change numbers):

``off``      no aggregation: one message per link packet;
``causal``   Algorithm 2 alone: a node holds back a message its child could not
             deliver and forwards it with the messages that unblock it;
``on``       Algorithm 2 plus link coalescing (messages queued behind a busy link
             share its next packet).

The start time of each node's broadcast (``--start``, ``--window W``) is the open
question: the thesis says "a Poisson distribution with interval rate
λ = 1000 u.t.".  ``exp`` (default, the issue's reading): exponential, mean ``W``;
``poisson``: a Poisson(``W``)-distributed integer time (≈ Normal(W, √W));
``uniform``: uniform in ``[0, W]``.  The main run uses ``--start``/``--window``;
the sweep (``--only sweep``) reruns ``--sweep-sizes`` with every model of
``SWEEP`` to see which one comes closest to Table 4.1 and Fig. 4.3.

Seeds: ``--seeds K`` (default 5) per point up to 256 nodes, 2 at 512, 1 at 1024
and above; the sweep uses ``--sweep-seeds`` (default 3).  Progress goes to stderr,
Markdown tables to stdout, every run and the means to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench._common import ROOT, fmt, mean, powers, run_measured, sizes_ok
from p2p.sim import DelayModel, Simulation

DEFAULT_OUT = ROOT / "bench" / "results" / "ch4.json"
QUICK_OUT = ROOT / "bench" / "results" / "ch4-quick.json"
TOPIC = "t"
PAYLOAD = b"x" * 50
MODES = ("off", "causal", "on")
STARTS = ("exp", "poisson", "uniform")
SWEEP: tuple[tuple[str, float], ...] = (
    ("exp", 1000.0),
    ("exp", 300.0),
    ("poisson", 1000.0),
    ("uniform", 1000.0),
    ("uniform", 500.0),
    ("uniform", 300.0),
)
"""Start-time models of the sweep: (model, window)."""

MSG_BINS: tuple[tuple[str, int, int], ...] = (
    ("1", 1, 1),
    ("2", 2, 2),
    ("3", 3, 3),
    ("4", 4, 4),
    ("5", 5, 5),
    ("(5,15]", 6, 15),
    (">15", 16, 1 << 30),
)
"""Table 4.2's rows (messages per packet), plus one for more than 15."""

SIZE_BINS: tuple[tuple[str, float, float], ...] = (
    ("<=100", -math.inf, 100.0),
    ("(100,200]", 100.0, 200.0),
    ("(200,300]", 200.0, 300.0),
    ("(300,400]", 300.0, 400.0),
    (">400", 400.0, math.inf),
)
"""Table 4.3's packet-size bins (bytes, header included).  The thesis writes
"< 100" for the first; a 100-byte packet (one message with 6 dependencies) is
counted there too, as the next bin starts at "(100"."""

DEPS_BINS: tuple[tuple[str, int, int], ...] = (
    ("0", 0, 0),
    ("1-4", 1, 4),
    ("5-9", 5, 9),
    ("10-12", 10, 12),
    (">12", 13, 1 << 30),
)
"""Fig. 4.3 bins: numbers of causal dependencies the prose quotes (0, <=4, <=9, >12)."""

PENDING_BINS: tuple[tuple[str, int, int], ...] = (
    ("<=50", 0, 50),
    ("(50,100]", 51, 100),
    ("(100,150]", 101, 150),
    ("(150,200]", 151, 200),
    ("(200,250]", 201, 250),
    (">250", 251, 1 << 30),
)
"""Fig. 4.6 bins: nodes by the largest pending set they held."""

THESIS: dict[str, Any] = {
    "table_4_1": {
        # N: (no aggr. packets, aggr. packets, % reduction, % aggregation)
        "16": [240, 232, 3.33, 3.02],
        "32": [992, 919, 7.36, 5.77],
        "64": [4032, 3513, 12.87, 9.05],
        "128": [16256, 13759, 15.36, 11.04],
        "256": [65280, 49262, 24.54, 15.41],
        "512": [261632, 191528, 26.79, 16.70],
        "1024": [1047552, 745943, 28.79, 19.14],
    },
    "table_4_2_256": {
        "pct_all": [84.59, 9.16, 3.12, 1.26, 0.66, 1.2, 0.0],
        "pct_aggregated": [None, 59.46, 20.25, 8.18, 4.31, 7.8, 0.0],
        "max_messages": 15,
    },
    "table_4_3_256": {
        "off": [63.67, 30.30, 6.03, 0.0, 0.0],
        "aggr": [52.66, 31.28, 7.62, 3.91, 4.54],
    },
    "fig_4_3_256": {"pct_zero": 27.0, "pct_gt12": 23.0, "max": 54},
    "fig_4_4": {
        "reception": "aggregation slower up to 512 (+8.1 % at 256); 7.4 % faster at 1024",
        "delivery": "within 3.2 % up to 512 nodes; aggregation 12.2 % faster at 1024",
        "holding": "held longer without aggregation: +5 % (16) to +53.4 % (1024)",
    },
    "fig_4_6_1024": {"aggr_le50": 569, "aggr_gt250": 24, "off_le50": "<256", "off_gt250": 212},
    "source": "de Araujo 2019, §4.5, Tables 4.1-4.3, Figs. 4.3, 4.4, 4.6 (30 runs per point)",
}


# --------------------------------------------------------------------- tasks


@dataclass(frozen=True, slots=True)
class Task:
    """One simulation run: N, aggregation mode, start-time model and seed."""

    exp: str
    """``main`` or ``sweep``."""
    n: int
    mode: str
    seed: int
    start: str = "exp"
    window: float = 1000.0
    tpp_stdev: float = 25.0
    tpc: float = 1.0
    tt: float = 1.0

    def key(self) -> tuple[Any, ...]:
        """The point this run belongs to (everything but the seed)."""
        return (self.exp, self.start, self.window, self.n, self.mode, *self.delays())

    def delays(self) -> tuple[float, float, float]:
        return (self.tpp_stdev, self.tpc, self.tt)

    def label(self) -> str:
        return (
            f"{self.exp} N={self.n} {self.mode} start={self.start}({self.window:g}) "
            f"seed={self.seed}"
        )

    def cost(self) -> float:
        """A rough relative run time, to start the longest runs first."""
        return float(self.n) ** 2


def _poisson(rng: random.Random, lam: float) -> int:
    """A Poisson(``lam``) variate: the number of unit-rate arrivals in ``[0, lam]``."""
    count, t = 0, rng.expovariate(1.0)
    while t <= lam:
        count += 1
        t += rng.expovariate(1.0)
    return count


def start_times(n: int, seed: int, start: str, window: float) -> list[float]:
    """The broadcast time of each node; the same for every aggregation mode."""
    rng = random.Random(f"ch4/{n}/{seed}/{start}/{window}")
    if start == "exp":
        return [rng.expovariate(1.0 / window) for _ in range(n)]
    if start == "poisson":
        return [float(_poisson(rng, window)) for _ in range(n)]
    if start == "uniform":
        return [rng.uniform(0.0, window) for _ in range(n)]
    raise ValueError(f"unknown start model {start!r}")


def _bin(value: float, bins: Sequence[tuple[str, float, float]]) -> int:
    for i, (_, lo, hi) in enumerate(bins):
        if lo < value <= hi:
            return i
    return len(bins) - 1


def _ibin(value: int, bins: Sequence[tuple[str, int, int]]) -> int:
    for i, (_, lo, hi) in enumerate(bins):
        if lo <= value <= hi:
            return i
    return len(bins) - 1


def run_task(task: Task) -> dict[str, Any]:
    started = time.perf_counter()
    sim = Simulation(
        list(range(task.n)),
        protocol="causal-broadcast",
        aggregation=task.mode,
        seed=task.seed,
        record_trace=False,
        delays=DelayModel(tpc=task.tpc, tt=task.tt, tpp_mean=100.0, tpp_stdev=task.tpp_stdev),
    )
    for node, at in enumerate(start_times(task.n, task.seed, task.start, task.window)):
        sim.schedule(at, "PUB", node, TOPIC, PAYLOAD)
    sim.run()
    rec = sim.recorder
    frames = rec.frames
    arrived = sum(rec.msgs_per_frame.values())
    msg_bins = [0] * len(MSG_BINS)
    for msgs, count in rec.msgs_per_frame.items():
        msg_bins[_ibin(msgs, MSG_BINS)] += count
    size_bins = [0] * len(SIZE_BINS)
    for size in rec.frame_sizes:
        size_bins[_bin(float(size), SIZE_BINS)] += 1
    deps = list(rec.barrier_sizes.values())
    deps_bins = [0] * len(DEPS_BINS)
    for d in deps:
        deps_bins[_ibin(d, DEPS_BINS)] += 1
    pend = [rec.pending_max.get(node, 0) for node in sim.ids]
    pend_bins = [0] * len(PENDING_BINS)
    for p in pend:
        pend_bins[_ibin(p, PENDING_BINS)] += 1
    reception_mean = mean(rec.reception)
    delivery_mean = mean(rec.delivery)
    metrics: dict[str, Any] = {
        "packets": frames,
        "packets_arrived": arrived,
        "messages_in_packets": sum(k * v for k, v in rec.msgs_per_frame.items()),
        "pct_multi": 100.0 * sum(v for k, v in rec.msgs_per_frame.items() if k > 1) / arrived
        if arrived
        else 0.0,
        "max_msgs_per_packet": max(rec.msgs_per_frame, default=0),
        "msgs_per_packet": {str(k): v for k, v in sorted(rec.msgs_per_frame.items())},
        "msg_bins": msg_bins,
        "bytes": sum(rec.frame_sizes),
        "size_bins": size_bins,
        "packets_gt1400": sum(1 for s in rec.frame_sizes if s > 1400),
        "deps_hist": {str(k): v for k, v in sorted(Counter(deps).items())},
        "deps_bins": deps_bins,
        "deps_mean": mean([float(d) for d in deps]),
        "deps_max": max(deps, default=0),
        "publications": len(deps),
        "receptions": len(rec.reception),
        "deliveries": len(rec.delivery),
        "expected_receptions": task.n * (task.n - 1),
        "reception_mean": reception_mean,
        "delivery_mean": delivery_mean,
        "holding_mean": delivery_mean - reception_mean,
        "held_back": sum(rec.held_by_node.values()),
        "pending_bins": pend_bins,
        "pending_max_mean": mean([float(p) for p in pend]),
        "pending_max_max": max(pend, default=0),
        "end_time": sim.now,
        "last_start": max(rec.publish_time.values(), default=0.0),
    }
    return {"task": asdict(task), "wall_s": time.perf_counter() - started, "metrics": metrics}


# ------------------------------------------------------------------ planning


def seeds_for(n: int, k: int) -> int:
    """``k`` seeds up to 256 nodes, 2 at 512, 1 above (the run time grows as N^2)."""
    if n <= 256:
        return k
    return min(k, 2) if n <= 512 else 1


def plan(args: argparse.Namespace) -> list[Task]:
    tasks: list[Task] = []
    delays = (args.tpp_stdev, args.tpc, args.tt)
    if "main" in args.only:
        for n in powers(args.min_nodes, args.max_nodes):
            for seed in range(
                1 + args.seed_offset, seeds_for(n, args.seeds) + 1 + args.seed_offset
            ):
                tasks.extend(
                    Task("main", n, mode, seed, args.start, args.window, *delays) for mode in MODES
                )
    if "sweep" in args.only:
        for start, window in SWEEP:
            if (start, window) == (args.start, args.window):
                continue  # the main run has (or will have) these points
            for n in args.sweep_sizes:
                for seed in range(1 + args.seed_offset, args.sweep_seeds + 1 + args.seed_offset):
                    tasks.extend(
                        Task("sweep", n, mode, seed, start, window, *delays)
                        for mode in args.sweep_modes
                    )
    return tasks


# --------------------------------------------------------------- aggregation


def _average(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over seeds of every numeric metric (element-wise for lists, summed for
    histograms)."""
    out: dict[str, Any] = {}
    for name, value in runs[0]["metrics"].items():
        values = [r["metrics"][name] for r in runs]
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out[name] = statistics.fmean(float(v) for v in values)
        elif isinstance(value, list):
            out[name] = [statistics.fmean(float(v[i]) for v in values) for i in range(len(value))]
        elif isinstance(value, dict):
            total: Counter[str] = Counter()
            for v in values:
                total.update(v)
            out[name + "_sum"] = dict(sorted(total.items(), key=lambda kv: int(kv[0])))
    out["seeds"] = len(runs)
    out["wall_s_max"] = max(float(r["wall_s"]) for r in runs)
    return out


def aggregate(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for res in results:
        groups[Task(**res["task"]).key()].append(res)
    points = []
    for key in sorted(groups):
        runs = sorted(groups[key], key=lambda r: int(r["task"]["seed"]))
        point = {k: v for k, v in runs[0]["task"].items() if k != "seed"}
        point["mean"] = _average(runs)
        points.append(point)
    return points


class Points:
    """Averaged points, looked up by (start, window, n, mode) whatever the experiment."""

    def __init__(self, points: list[dict[str, Any]]) -> None:
        self.by_key: dict[tuple[str, float, int, str], dict[str, Any]] = {}
        for p in sorted(points, key=lambda p: p["exp"] != "main"):
            key = (str(p["start"]), float(p["window"]), int(p["n"]), str(p["mode"]))
            self.by_key.setdefault(key, p["mean"])

    def get(self, start: str, window: float, n: int, mode: str) -> dict[str, Any] | None:
        return self.by_key.get((start, float(window), n, mode))

    def sizes(self, start: str, window: float) -> list[int]:
        return sorted({k[2] for k in self.by_key if k[0] == start and k[1] == float(window)})

    def models(self) -> list[tuple[str, float]]:
        return sorted({(k[0], k[1]) for k in self.by_key})


# ----------------------------------------------------------------- reporting


def _red(off: dict[str, Any], agg: dict[str, Any]) -> float:
    return 100.0 * (1.0 - float(agg["packets"]) / float(off["packets"]))


def _pct(values: Sequence[float]) -> list[float]:
    total = sum(values) or 1.0
    return [100.0 * v / total for v in values]


def table_4_1(pts: Points, start: str, window: float) -> str:
    lines = [
        f"### Table 4.1: link packets, start = {start}({window:g})",
        "",
        "| N | off | causal | on | red. causal | red. on | thesis red. | >1 msg causal "
        "| >1 msg on | thesis >1 msg | causal within ±3 | seeds |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for n in pts.sizes(start, window):
        off = pts.get(start, window, n, "off")
        ca = pts.get(start, window, n, "causal")
        on = pts.get(start, window, n, "on")
        if off is None or ca is None or on is None:
            continue
        th = THESIS["table_4_1"].get(str(n))
        rc, ro = _red(off, ca), _red(off, on)
        ok = "-" if th is None else ("yes" if abs(rc - th[2]) <= 3.0 else f"no ({rc - th[2]:+.1f})")
        lines.append(
            f"| {n} | {off['packets']:.0f} | {ca['packets']:.0f} | {on['packets']:.0f} "
            f"| {rc:.2f} | {ro:.2f} | {fmt(th[2] if th else None, 2)} | {ca['pct_multi']:.2f} "
            f"| {on['pct_multi']:.2f} | {fmt(th[3] if th else None, 2)} | {ok} "
            f"| {off['seeds']:.0f} |"
        )
    return "\n".join(lines)


def table_4_2(pts: Points, start: str, window: float, n: int) -> str:
    th = THESIS["table_4_2_256"]
    rows = {m: pts.get(start, window, n, m) for m in MODES}
    if any(r is None for r in rows.values()):
        return ""
    lines = [
        f"### Table 4.2: messages per link packet, {n} nodes, start = {start}({window:g})",
        "",
        "% of all packets, and (in brackets) % of the packets with more than one message.",
        "",
        "| messages | off | causal | on | thesis (256) |",
        "|---|---:|---:|---:|---:|",
    ]
    pct_all = {m: _pct(r["msg_bins"]) for m, r in rows.items() if r is not None}
    pct_agg = {m: _pct(r["msg_bins"][1:]) for m, r in rows.items() if r is not None}
    for i, (name, _, _) in enumerate(MSG_BINS):
        cells = []
        for m in MODES:
            agg = "" if i == 0 else f" ({pct_agg[m][i - 1]:.2f})"
            cells.append(f"{pct_all[m][i]:.2f}{agg}")
        tagg = th["pct_aggregated"][i]
        tcell = f"{th['pct_all'][i]:.2f}" + ("" if tagg is None else f" ({tagg:.2f})")
        lines.append(f"| {name} | {' | '.join(cells)} | {tcell} |")
    mx = " / ".join(f"{rows[m]['max_msgs_per_packet']:.0f}" for m in MODES)  # type: ignore[index]
    lines += [
        "",
        f"Largest packet (messages, off / causal / on, mean over seeds): {mx}; thesis 15.",
    ]
    return "\n".join(lines)


def table_4_3(pts: Points, start: str, window: float, n: int) -> str:
    th = THESIS["table_4_3_256"]
    rows = {m: pts.get(start, window, n, m) for m in MODES}
    if any(r is None for r in rows.values()):
        return ""
    lines = [
        f"### Table 4.3: link packets by size (bytes), {n} nodes, start = {start}({window:g})",
        "",
        "| size | off | causal | on | thesis off | thesis aggr. |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    pct = {m: _pct(r["size_bins"]) for m, r in rows.items() if r is not None}
    for i, (name, _, _) in enumerate(SIZE_BINS):
        lines.append(
            f"| {name} | {pct['off'][i]:.2f} | {pct['causal'][i]:.2f} | {pct['on'][i]:.2f} "
            f"| {th['off'][i]:.2f} | {th['aggr'][i]:.2f} |"
        )
    b = {m: r["bytes"] for m, r in rows.items() if r is not None}
    big = {m: r["packets_gt1400"] for m, r in rows.items() if r is not None}
    lines += [
        "",
        f"Bytes on the links (mean over seeds): off {b['off']:.0f}, causal {b['causal']:.0f} "
        f"({100 * (1 - b['causal'] / b['off']):.1f} % less), on {b['on']:.0f} "
        f"({100 * (1 - b['on'] / b['off']):.1f} % less).  Packets over 1400 bytes: causal "
        f"{big['causal']:.1f}, on {big['on']:.1f} (thesis: 0.29 % of the packets).",
    ]
    return "\n".join(lines)


def table_4_3_deps(pts: Points, models: Sequence[tuple[str, float]], n: int) -> str:
    th = THESIS["fig_4_3_256"]
    lines = [
        f"### Fig. 4.3: causal dependencies per message (compressed clock entries), {n} nodes",
        "",
        "| start | mode | "
        + " | ".join(name for name, _, _ in DEPS_BINS)
        + " | mean | max | seeds |",
        "|---|---|" + "---:|" * (len(DEPS_BINS) + 3),
    ]
    for start, window in models:
        for mode in ("off", "causal", "on"):
            r = pts.get(start, window, n, mode)
            if r is None:
                continue
            cells = " | ".join(f"{x:.1f}%" for x in _pct(r["deps_bins"]))
            lines.append(
                f"| {start}({window:g}) | {mode} | {cells} | {r['deps_mean']:.1f} "
                f"| {r['deps_max']:.0f} | {r['seeds']:.0f} |"
            )
    lines.append(
        f"| thesis | aggr. | {th['pct_zero']}% | - | - | - | {th['pct_gt12']}% | - "
        f"| {th['max']} | 30 |"
    )
    return "\n".join(lines)


def table_4_4(pts: Points, start: str, window: float) -> str:
    lines = [
        f"### Fig. 4.4: mean reception / delivery latency (u.t.), start = {start}({window:g})",
        "",
        "| N | recv off | recv causal | recv on | deliv off | deliv causal | deliv on "
        "| causal vs off deliv. | on vs off deliv. | hold off | hold causal | hold on |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in pts.sizes(start, window):
        r = {m: pts.get(start, window, n, m) for m in MODES}
        off, ca, on = r["off"], r["causal"], r["on"]
        if off is None or ca is None or on is None:
            continue
        dc = 100.0 * (ca["delivery_mean"] / off["delivery_mean"] - 1.0)
        do = 100.0 * (on["delivery_mean"] / off["delivery_mean"] - 1.0)
        lines.append(
            f"| {n} | {off['reception_mean']:.1f} | {ca['reception_mean']:.1f} "
            f"| {on['reception_mean']:.1f} | {off['delivery_mean']:.1f} "
            f"| {ca['delivery_mean']:.1f} | {on['delivery_mean']:.1f} | {dc:+.1f} % "
            f"| {do:+.1f} % | {off['holding_mean']:.1f} | {ca['holding_mean']:.1f} "
            f"| {on['holding_mean']:.1f} |"
        )
    th = THESIS["fig_4_4"]
    lines += [
        "",
        f"Thesis: reception {th['reception']}; delivery {th['delivery']}; {th['holding']}.",
    ]
    return "\n".join(lines)


def table_4_6(pts: Points, start: str, window: float) -> str:
    sizes = pts.sizes(start, window)
    if not sizes:
        return ""
    n = sizes[-1]
    th = THESIS["fig_4_6_1024"]
    lines = [
        f"### Fig. 4.6: nodes by largest pending set, {n} nodes, start = {start}({window:g})",
        "",
        "| mode | " + " | ".join(name for name, _, _ in PENDING_BINS) + " | mean | max | seeds |",
        "|---|" + "---:|" * (len(PENDING_BINS) + 3),
    ]
    for mode in MODES:
        r = pts.get(start, window, n, mode)
        if r is None:
            continue
        cells = " | ".join(f"{x:.1f}" for x in r["pending_bins"])
        lines.append(
            f"| {mode} | {cells} | {r['pending_max_mean']:.1f} | {r['pending_max_max']:.0f} "
            f"| {r['seeds']:.0f} |"
        )
    lines.append(
        f"| thesis aggr. (1024) | {th['aggr_le50']} | - | - | - | - | {th['aggr_gt250']} | - | - "
        "| 30 |"
    )
    lines.append(
        f"| thesis off (1024) | {th['off_le50']} | - | - | - | - | {th['off_gt250']} | - | - | 30 |"
    )
    return "\n".join(lines)


def table_sweep(pts: Points) -> str:
    models = pts.models()
    sizes = sorted({n for s, w in models for n in pts.sizes(s, w)})
    lines = [
        "### Start-time sweep: % packet reduction vs off, causal (/ on where run), Fig. 4.3 at 256",
        "",
        "| start | "
        + " | ".join(f"N={n}" for n in sizes)
        + " | 0 deps (256) | >12 deps (256) | max deps (256) | deliv. causal vs off (256) |",
        "|---|" + "---:|" * (len(sizes) + 4),
    ]
    for start, window in models:
        cells = []
        for n in sizes:
            off = pts.get(start, window, n, "off")
            ca = pts.get(start, window, n, "causal")
            on = pts.get(start, window, n, "on")
            if off is None or ca is None:
                cells.append("-")
            else:
                hybrid = "" if on is None else f" / {_red(off, on):.1f}"
                cells.append(f"{_red(off, ca):.1f}{hybrid}")
        r = pts.get(start, window, 256, "causal")
        o = pts.get(start, window, 256, "off")
        if r is None or o is None:
            extra = "- | - | - | -"
        else:
            d = _pct(r["deps_bins"])
            dl = 100.0 * (r["delivery_mean"] / o["delivery_mean"] - 1.0)
            extra = f"{d[0]:.1f}% | {d[-1]:.1f}% | {r['deps_max']:.0f} | {dl:+.1f} %"
        lines.append(f"| {start}({window:g}) | {' | '.join(cells)} | {extra} |")
    th = THESIS["table_4_1"]
    lines.append(
        "| thesis | "
        + " | ".join(f"{th[str(n)][2]:.1f}" if str(n) in th else "-" for n in sizes)
        + " | 27% | 23% | 54 | within 3.2 % |"
    )
    return "\n".join(lines)


def report(results: list[dict[str, Any]], start: str, window: float) -> str:
    pts = Points(aggregate(results))
    every = sorted({n for s, w in pts.models() for n in pts.sizes(s, w)})
    n_ref = 256 if 256 in every else max(every, default=0)
    out = [table_4_3_deps(pts, pts.models(), n_ref)]
    if pts.sizes(start, window):
        out = [
            table_4_1(pts, start, window),
            table_4_2(pts, start, window, n_ref),
            table_4_3(pts, start, window, n_ref),
            *out,
            table_4_4(pts, start, window),
            table_4_6(pts, start, window),
        ]
    if len(pts.models()) > 1:
        out.append(table_sweep(pts))
    return "\n\n".join(s for s in out if s)


# ----------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.reproduce_ch4",
        description="Rerun the causal-aggregation experiments of thesis §4.5.",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: N <= 64, 1 seed")
    p.add_argument("--seeds", type=int, help="runs per point up to 256 nodes (default 5)")
    p.add_argument("--min-nodes", type=int, default=16, help="smallest N (default 16)")
    p.add_argument("--max-nodes", type=int, help="largest N (default 1024; --quick: 64)")
    p.add_argument("--start", choices=STARTS, default="exp", help="start-time model (main run)")
    p.add_argument(
        "--window", type=float, default=1000.0, help="mean (exp, poisson) or width (uniform)"
    )
    p.add_argument(
        "--tpp-stdev",
        type=float,
        default=25.0,
        help="standard deviation of t_pp ~ Normal(100, sd) (default 25, thesis §4.5.1)",
    )
    p.add_argument("--tpc", type=float, default=1.0, help="processing time per packet (1)")
    p.add_argument("--tt", type=float, default=1.0, help="transmission time per packet (1)")
    p.add_argument("--only", default="main,sweep", help="comma-separated: main, sweep")
    p.add_argument(
        "--sweep-sizes",
        default="64,256",
        help="comma-separated N of the start-time sweep (default 64,256; --quick: 32)",
    )
    p.add_argument("--sweep-seeds", type=int, default=2, help="runs per sweep point (default 2)")
    p.add_argument(
        "--sweep-modes",
        default="off,causal",
        help="comma-separated aggregation modes of the sweep (default off,causal)",
    )
    p.add_argument(
        "--seed-offset",
        type=int,
        default=0,
        help="seeds start at 1 + this (to add seeds to saved results; merge with --report)",
    )
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes")
    p.add_argument(
        "--out", type=Path, help=f"JSON output (default {DEFAULT_OUT.relative_to(ROOT)})"
    )
    p.add_argument(
        "--report",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="run nothing: print the tables of these saved results, merged",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.report:
        results: list[dict[str, Any]] = []
        for path in args.report:
            results.extend(json.loads(path.read_text())["runs"])
        print(report(results, args.start, args.window))
        return 0
    args.only = {x.strip() for x in args.only.split(",") if x.strip()}
    if args.only - {"main", "sweep"}:
        print(f"unknown experiment(s): {', '.join(sorted(args.only))}", file=sys.stderr)
        return 2
    if args.seeds is None:
        args.seeds = 1 if args.quick else 5
    if args.max_nodes is None:
        args.max_nodes = 64 if args.quick else 1024
    if args.quick and args.sweep_sizes == "64,256":
        args.sweep_sizes = "32"
        args.sweep_seeds = 1
    args.sweep_sizes = [int(x) for x in args.sweep_sizes.split(",") if x.strip()]
    args.sweep_modes = [x.strip() for x in args.sweep_modes.split(",") if x.strip()]
    if set(args.sweep_modes) - set(MODES):
        print(f"unknown mode(s) in --sweep-modes: {args.sweep_modes}", file=sys.stderr)
        return 2
    if args.out is None:
        args.out = QUICK_OUT if args.quick else DEFAULT_OUT
    if not sizes_ok(args.seeds, args.min_nodes, args.max_nodes):
        return 2
    host, results, wall = run_measured(plan(args), args.jobs, run_task)
    doc: dict[str, Any] = {
        "command": "python -m bench.reproduce_ch4 "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": {
            "quick": args.quick,
            "seeds": args.seeds,
            "min_nodes": args.min_nodes,
            "max_nodes": args.max_nodes,
            "start": args.start,
            "window": args.window,
            "experiments": sorted(args.only),
            "sweep": [list(m) for m in SWEEP],
            "sweep_sizes": args.sweep_sizes,
            "sweep_seeds": args.sweep_seeds,
            "seed_offset": args.seed_offset,
            "sweep_modes": args.sweep_modes,
            "jobs": args.jobs,
            "delays": {
                "tpc": args.tpc,
                "tt": args.tt,
                "tpp": f"Normal(100, {args.tpp_stdev:g}) per packet",
            },
            "payload_bytes": len(PAYLOAD),
            "protocol": "causal-broadcast",
        },
        "machine": host,
        "wall_s": wall,
        "thesis": THESIS,
        "points": aggregate(results),
        "runs": sorted(results, key=lambda r: (*Task(**r["task"]).key(), r["task"]["seed"])),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(report(results, args.start, args.window))
    print()
    print(f"{len(results)} runs in {wall:.0f} s; all numbers in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runtime benchmarks: real nodes on loopback, one process per node, beside ZeroMQ and Zenoh.

Run from the repository root (needs the ``bench`` extra: pyzmq, eclipse-zenoh, psutil)::

    python -m bench.runtime                  # full run, about 7 minutes
    python -m bench.runtime --quick          # smoke run, under a minute
    python -m bench.runtime --out bench/results/runtime.json --systems ours,zenoh

Every workload runs on every system in the same invocation, one OS process per
node (``bench._runtime_workers``), 64-byte payloads, TCP on 127.0.0.1:

``cold``       5 nodes start at once; node 0 publishes 1,000 msg/s as soon as
               everyone has subscribed: time from process spawn to each
               subscriber's first delivery (and to import, up, subscribed);
               ours a second time with static seeds instead of mDNS.
``idle``       the same 5 nodes, subscribed, idle for a few seconds: RSS, USS
               and CPU % of each process (psutil); ours also with seeds.
``latency``    fan-out 1 -> 4 at a paced 1,000 msg/s: latency p50/p99/max
               over the steady state (warm-up dropped), achieved rate.
``throughput`` fan-out 1 -> 4, the publisher as fast as the system's own flow
               control allows (``ours``: at most 1,024 publications queued in
               the core; ZeroMQ: XPUB with ``XPUB_NODROP``; Zenoh:
               ``CongestionControl.BLOCK``): messages/s delivered to the slowest
               subscriber over the steady state, with every message delivered.
``sustained``  fan-out 1 -> 4 paced at 80 % of that rate: checks it is
               sustainable open-loop (no loss, p99 of the two halves of the
               window close, i.e. no growing backlog).  For ``ours`` one more
               flat-out fan-out (``traced_s`` long) writes every node's trace,
               checked as ``hot``'s is; its rates are not reported (the
               trace costs CPU).
``hot``        5 nodes each publishing 500 msg/s on one topic and subscribed
               to it: delivered rate per node, latency, per-source FIFO and,
               for ``ours``, the run's trace checked for causal order,
               FIFO and exactly-once (``p2p.sim.check_trace``).
``import``     ``python -c "import X"`` wall time, minus the bare interpreter's.
``preauth``    ours only: a subscriber's peak RSS (VmHWM) idle and under 400
               unauthenticated connections each announcing a 1 MiB frame and
               holding all but its last byte (``bench._preauth``), and whether
               it still delivers 200 messages.
``telemetry``  ours only: ``throughput`` and ``latency`` with telemetry recording
               off and on (``NodeConfig.telemetry_dir``, a spool per node),
               runs interleaved in pairs (off/on, then on/off, ...): the on/off
               ratios, the spool bytes written per node per second, and the
               spool's counters checked against the harness's counts.  Not in
               the default ``--only``.

Our nodes find each other by mDNS (a service type of their own per run) in a
throw-away PSK fleet; causal order and encryption are always on.  The table
goes to stdout, every number to ``--out`` (JSON) with the machine and the
ratios to the baselines measured in the same run.  ``--profile DIR`` runs our
nodes under cProfile.  See ``docs/runtime-benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import IO, Any

from bench import _preauth as preauth
from bench._common import ROOT, machine
from bench._runtime_workers import FLOORS, PAYLOAD_SIZE, PROFILE_ENV, TOPIC, Spec
from p2p import percentile_of

DEFAULT_OUT = ROOT / "bench" / "out" / "runtime.json"
SYSTEMS = ("ours", "zmq", "zenoh")
WORKLOADS = frozenset({"cold", "latency", "throughput", "hot", "import", "telemetry", "preauth"})
NODES = 5
"""Processes per workload: 1 publisher + 4 subscribers, or 5 hot-topic peers."""
TARGET_RSS_MB = 40.0
TARGET_P99_MS = 5.0
TARGET_TPUT_RATIO = 0.5
TARGET_TELEMETRY_RATIO = 0.95


class BenchError(RuntimeError):
    """A worker failed or did not answer in time."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Durations (seconds) and rates of one run."""

    cold_s: float = 2.0
    settle_s: float = 1.0
    idle_s: float = 5.0
    latency_rate: float = 1000.0
    latency_s: float = 10.0
    latency_repeat: int = 3
    throughput_s: float = 8.0
    throughput_repeat: int = 3
    sustained_fraction: float = 0.8
    """Of the measured throughput, for the paced check (0: no check)."""
    sustained_s: float = 8.0
    traced_s: float = 4.0
    """Seconds of the traced flat-out fan-out (``ours``; 0: none)."""
    hot_rate: float = 500.0
    hot_s: float = 10.0
    warmup_s: float = 2.0
    drain_s: float = 2.0
    import_repeat: int = 7
    cold_seeds: bool = True
    """Also time our cold start with static seeds instead of mDNS."""
    telemetry_repeat: int = 5
    """``telemetry``: runs of each workload with recording off, and as many with it on."""
    telemetry_window: float = 0.0
    """``telemetry``: seconds per telemetry window (0: ``NodeConfig``'s default, 10 s)."""

    @staticmethod
    def quick() -> Settings:
        """The short smoke run of ``--quick``."""
        return Settings(
            cold_s=0.5,
            settle_s=0.3,
            idle_s=1.0,
            latency_s=1.5,
            latency_repeat=1,
            throughput_s=1.5,
            throughput_repeat=1,
            sustained_fraction=0.0,
            traced_s=0.0,
            hot_s=1.5,
            warmup_s=0.5,
            drain_s=0.3,
            import_repeat=1,
            cold_seeds=False,
            telemetry_repeat=1,
        )


# ------------------------------------------------------------------ workers


class Group:
    """The worker processes of one workload; all killed on exit, whatever happened."""

    def __init__(self, label: str, specs: list[Spec], logdir: Path) -> None:
        self.label = label
        self.specs = specs
        self.logdir = logdir
        self.procs: list[subprocess.Popen[str]] = []
        self.lines: list[queue.Queue[str | None]] = []
        self.spawn_ns: list[int] = []
        self.logs: list[Path] = []

    def __enter__(self) -> Group:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        env["BENCH_RUNTIME_LABEL"] = self.label
        try:
            for spec in self.specs:
                self._spawn(spec, env)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, spec: Spec, env: dict[str, str]) -> None:
        """Start one worker, its stderr to a log file, its stdout read by a thread."""
        log = self.logdir / f"{self.label}-{spec.index}.log"
        self.logs.append(log)
        module = "bench._floor_worker" if spec.system in FLOORS else "bench._runtime_workers"
        cmd = [sys.executable, "-m", module, json.dumps(asdict(spec))]
        with open(log, "w", encoding="utf-8") as err:
            self.spawn_ns.append(time.time_ns())
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, text=True, bufsize=1,
            )  # fmt: skip
        self.procs.append(proc)
        lines: queue.Queue[str | None] = queue.Queue()
        self.lines.append(lines)
        assert proc.stdout is not None
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()

    def send(self, command: str) -> None:
        """One command line to every worker."""
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(command + "\n")
            proc.stdin.flush()

    def expect(self, event: str, timeout: float) -> list[dict[str, Any]]:
        """Every worker's next ``event`` message, or :class:`BenchError`."""
        deadline = time.monotonic() + timeout
        out = []
        for i, lines in enumerate(self.lines):
            while True:
                try:
                    line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise self._error(i, f"no {event!r} within {timeout:.0f} s") from None
                if line is None:
                    raise self._error(i, f"exited before {event!r}")
                if line.startswith("{"):
                    msg: dict[str, Any] = json.loads(line)
                    if msg["ev"] != event:
                        raise self._error(i, f"sent {msg['ev']!r} instead of {event!r}")
                    out.append(msg)
                    break
        return out

    def _error(self, i: int, what: str) -> BenchError:
        """A failure of worker ``i`` with the end of its stderr."""
        tail = self.logs[i].read_text(encoding="utf-8", errors="replace")[-3000:]
        return BenchError(f"{self.label} worker {i}: {what}\n--- its stderr ---\n{tail}")

    def close(self) -> None:
        """Ask every worker to exit; kill whatever is still running after a grace period."""
        for proc in self.procs:
            try:
                if proc.stdin is not None and proc.poll() is None:
                    proc.stdin.write("exit\n")
                    proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    """Copy a worker's stdout lines into ``lines``; ``None`` at end of output."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Bench:
    """Builds the workers' specs for each system and runs the workloads."""

    def __init__(self, settings: Settings, workdir: Path, verbose: bool = True) -> None:
        self.s = settings
        self.workdir = workdir
        self.verbose = verbose
        self.node_dirs = _make_fleet(workdir)
        self.tree = source_tree(self.node_dirs)
        self.runs = 0

    def say(self, text: str) -> None:
        """A progress line on stderr."""
        if self.verbose:
            print(text, file=sys.stderr, flush=True)

    def specs(
        self, system: str, publishers: list[int], rate: float, duration: float, warmup: float
    ) -> list[Spec]:
        """The 5 workers of one workload: ``publishers`` publish, the others only subscribe."""
        ports = free_ports(NODES)
        service = f"_b{uuid.uuid4().hex[:12]}._tcp.local."
        return [
            Spec(
                system=system,
                index=i,
                nodes=NODES,
                publish=i in publishers,
                subscribe=system == "ours" or len(publishers) > 1 or i not in publishers,
                rate=rate,
                duration=duration,
                warmup=warmup,
                drain=self.s.drain_s,
                ports=ports,
                publishers=publishers,
                node_dir=str(self.node_dirs[i]),
                service_type=service,
                children=list(self.tree[i]),
            )
            for i in range(NODES)
        ]

    def group(self, label: str, specs: list[Spec]) -> Group:
        """The workers of one run, numbered in the order of the runs."""
        self.runs += 1
        return Group(f"{self.runs:02d}-{label}", specs, self.workdir)

    def start(self, g: Group) -> list[dict[str, Any]]:
        """Up, subscribe, subscribed; the ``up`` messages."""
        ups = g.expect("up", 120)
        g.send("sub")
        g.expect("subscribed", 60)
        return ups

    def go(self, g: Group, spec: Spec, delay: float = 0.3) -> tuple[int, list[dict[str, Any]]]:
        """Start publishing ``delay`` s from now; every worker's result."""
        start_ns = time.time_ns() + int(delay * 1e9)
        g.send(f"go {start_ns}")
        return start_ns, g.expect("result", delay + spec.duration + spec.drain + 60)

    # ---------------------------------------------------------- workloads

    def cold(self, system: str, seeds: bool = False) -> dict[str, Any]:
        """Spawn to first delivery: go as soon as everyone has subscribed.

        ``seeds``: our nodes find each other through static seeds, not mDNS.
        """
        specs = self.specs(system, [0], self.s.latency_rate, self.s.cold_s, 0.0)
        specs = [replace(x, seeds=seeds) for x in specs]
        with self.group(f"{system}-cold{'-seeds' if seeds else ''}", specs) as g:
            ups = g.expect("up", 120)
            g.send("sub")
            subs = g.expect("subscribed", 60)
            _, results = self.go(g, specs[0], delay=0.0)
        firsts = [
            (r["recv"]["first_ns"] - g.spawn_ns[i]) / 1e9
            for i, r in enumerate(results)
            if i != 0 and r["recv"]["count"]
        ]

        def since_spawn(msgs: list[dict[str, Any]], key: str) -> dict[str, float]:
            return _spread([(m[key] - t) / 1e9 for m, t in zip(msgs, g.spawn_ns, strict=True)])

        return {
            "first_delivery_s": _spread(firsts),
            "subscribers_delivered": len(firsts),
            "imported_s": since_spawn(ups, "imported_ns"),
            "up_s": since_spawn(ups, "ns"),
            "subscribed_s": since_spawn(subs, "ns"),
        }

    def latency(
        self, system: str, idle: bool = True, trace: Path | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Idle footprint (unless not ``idle``), then fan-out at a paced 1,000 msg/s
        (``latency_rate``); with ``trace``, each node's trace is ``trace/n<index>.trace``."""
        s = self.s
        specs = self.specs(system, [0], s.latency_rate, s.latency_s, s.warmup_s)
        if trace is not None:
            specs = [replace(x, trace=str(trace / f"n{x.index}.trace")) for x in specs]
        with self.group(f"{system}-latency", specs) as g:
            self.start(g)
            footprint = measure_idle(g, s.settle_s, s.idle_s) if idle else {}
            if not idle:
                time.sleep(s.settle_s)
            _, results = self.go(g, specs[0])
        return footprint, fanout_summary(specs[0], results)

    def idle_seeds(self) -> dict[str, Any]:
        """Our idle footprint with static seeds instead of mDNS (no zeroconf thread)."""
        specs = [replace(x, seeds=True) for x in self.specs("ours", [0], 1.0, 0.0, 0.0)]
        with self.group("ours-idle-seeds", specs) as g:
            self.start(g)
            return measure_idle(g, self.s.settle_s, self.s.idle_s)

    def throughput(self, system: str) -> dict[str, Any]:
        """Fan-out with the publisher flat out under the system's flow control."""
        specs = self.specs(system, [0], 0.0, self.s.throughput_s, self.s.warmup_s)
        with self.group(f"{system}-throughput", specs) as g:
            self.start(g)
            time.sleep(self.s.settle_s)
            _, results = self.go(g, specs[0])
        return fanout_summary(specs[0], results)

    def traced(self) -> dict[str, Any]:
        """Our fan-out flat out with every node's trace written, then checked for
        causal order, FIFO and exactly-once (as ``hot``'s)."""
        specs = self.specs("ours", [0], 0.0, self.s.traced_s, self.s.warmup_s)
        specs = [replace(x, trace=str(self.workdir / f"fanout-{x.index}.trace")) for x in specs]
        with self.group("ours-traced", specs) as g:
            ups = self.start(g)
            time.sleep(self.s.settle_s)
            _, results = self.go(g, specs[0])
        out = fanout_summary(specs[0], results)
        out["trace_check"] = check_traces(specs, [u["id"] for u in ups])
        return out

    def sustained(self, system: str, rate: float) -> dict[str, Any]:
        """Fan-out paced at ``rate``: no loss and no growing latency expected."""
        specs = self.specs(system, [0], rate, self.s.sustained_s, self.s.warmup_s)
        with self.group(f"{system}-sustained", specs) as g:
            self.start(g)
            time.sleep(self.s.settle_s)
            _, results = self.go(g, specs[0])
        return fanout_summary(specs[0], results)

    def telemetry(self, workload: str, on: bool) -> dict[str, Any]:
        """Our fan-out (``throughput`` or ``latency``) with telemetry recording ``on`` or off.

        On, every node spools into a directory of its own with the default
        settings (or ``telemetry_window``); the spools are read back once the
        workers have exited (:func:`spool_summary`).
        """
        s = self.s
        paced = workload == "latency"
        rate, duration = (s.latency_rate, s.latency_s) if paced else (0.0, s.throughput_s)
        specs = self.specs("ours", [0], rate, duration, s.warmup_s)
        label = f"ours-{workload}-telemetry-{'on' if on else 'off'}"
        if on:
            run = f"{self.runs + 1:02d}"
            specs = [
                replace(
                    x,
                    telemetry_dir=str(self.workdir / f"spool-{run}-{x.index}"),
                    telemetry_window=s.telemetry_window,
                )
                for x in specs
            ]
        load = os.getloadavg()[0]
        with self.group(label, specs) as g:
            self.start(g)
            time.sleep(s.settle_s)
            _, results = self.go(g, specs[0])
        out = fanout_summary(specs[0], results)
        out["telemetry"] = on
        out["loadavg"] = [load, os.getloadavg()[0]]
        if on:
            out["spool"] = spool_summary(specs, results)
        return out

    def hot(self, system: str) -> dict[str, Any]:
        """Every node publishes ``hot_rate`` msg/s on the topic it subscribes to."""
        s = self.s
        everyone = list(range(NODES))
        specs = self.specs(system, everyone, s.hot_rate, s.hot_s, s.warmup_s)
        if system == "ours":
            specs = [replace(x, trace=str(self.workdir / f"trace-{x.index}.jsonl")) for x in specs]
        with self.group(f"{system}-hot", specs) as g:
            ups = self.start(g)
            time.sleep(s.settle_s)
            _, results = self.go(g, specs[0])
        out = hot_summary(specs[0], results)
        if system == "ours":
            out["trace_check"] = check_traces(specs, [u["id"] for u in ups])
        return out


def _make_fleet(workdir: Path) -> list[Path]:
    """A PSK fleet of :data:`NODES` node directories under ``workdir``."""
    from p2p.fleet import add_node, init_fleet

    init_fleet(workdir / "fleet", psk=True, name="bench")
    dirs = [workdir / f"node{i}" for i in range(NODES)]
    for i, d in enumerate(dirs):
        add_node(workdir / "fleet", d, name=f"bench{i}")
    return dirs


def source_tree(node_dirs: Sequence[Path]) -> dict[int, tuple[int, ...]]:
    """The spanning tree our nodes build from the first one when every node
    subscribes (``vcube.Hypercube.tree``), by index: ``{index: children}``."""
    from p2p.fleet import node_info
    from vcube import Hypercube

    ids = [node_info(d).node_id for d in node_dirs]
    tree = Hypercube(ids).tree(ids[0])
    return {i: tuple(ids.index(c) for c in tree[node]) for i, node in enumerate(ids)}


# ---------------------------------------------------------------- measures


def measure_idle(g: Group, settle: float, seconds: float) -> dict[str, Any]:
    """RSS, USS and CPU % of every worker, subscribed and idle."""
    import psutil

    time.sleep(settle)
    procs = [psutil.Process(p.pid) for p in g.procs]
    before = [p.cpu_times() for p in procs]
    t0 = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - t0
    after = [p.cpu_times() for p in procs]
    cpu = [
        100 * ((a.user + a.system) - (b.user + b.system)) / wall
        for a, b in zip(after, before, strict=True)
    ]
    rss = [p.memory_info().rss / 2**20 for p in procs]
    uss = [p.memory_full_info().uss / 2**20 for p in procs]
    threads = [p.num_threads() for p in procs]
    return {
        "rss_mb": _spread(rss),
        "uss_mb": _spread(uss),
        "cpu_percent": _spread(cpu),
        "threads": threads,
        "per_node_rss_mb": rss,
        "seconds": seconds,
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (``q`` in 0..100, ``p2p._stats``); 0 when empty."""
    return float(percentile_of(sorted(values), q)) if values else 0.0


def _spread(values: Sequence[float]) -> dict[str, float]:
    """Median, mean, min and max of ``values`` (zeros when empty)."""
    if not values:
        return {"median": 0.0, "mean": 0.0, "min": 0.0, "max": 0.0}
    return {
        "median": statistics.median(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


def latency_ms(results: list[dict[str, Any]]) -> dict[str, float]:
    """Pooled latency (ms) of every subscriber's steady-state samples."""
    pooled = [x / 1000 for r in results for x in r["recv"]["latency_us"]]
    return {
        "p50": percentile(pooled, 50),
        "p99": percentile(pooled, 99),
        "max": max(pooled, default=0.0),
        "samples": sum(r["recv"]["latency_samples"] for r in results),
    }


def per_subscriber_ms(results: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Each subscriber's own latency p50 and p99 (ms), fastest first."""
    return fastest_first([x / 1000 for x in r["recv"]["latency_us"]] for r in results)


def fastest_first(samples: Iterable[Sequence[float]]) -> list[dict[str, float]]:
    """p50, p99 and count of each non-empty list of latencies (ms), by p50."""
    rows = [
        {"p50": percentile(ms, 50), "p99": percentile(ms, 99), "n": len(ms)} for ms in samples if ms
    ]
    return sorted(rows, key=lambda h: h["p50"])


def _undelivered(results: list[dict[str, Any]], receivers: list[int], sources: list[int]) -> int:
    """Messages published by ``sources`` that a receiver had not got when the run ended
    (drain included): lost, or still queued behind a backlog."""
    lost = 0
    for i in receivers:
        got = results[i]["recv"]["sources"]
        for s in sources:
            if s != i:
                lost += results[s]["sent"]["count"] - got.get(str(s), {}).get("count", 0)
    return lost


def _stats(results: list[dict[str, Any]]) -> dict[str, int]:
    """Our node counters summed over the workers (empty for the baselines)."""
    total: dict[str, int] = {}
    for r in results:
        for k, v in r["stats"].items():
            total[k] = total.get(k, 0) + int(v)
    return total


def _cpu_percent(results: list[dict[str, Any]]) -> float:
    """Mean CPU use of ``results``' processes from ``go`` to their result, in % of a core."""
    return statistics.fmean(100 * r["cpu_run_s"] / r["wall_run_s"] for r in results)


def fanout_summary(spec: Spec, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Rates, loss, order and latency of a 1 -> 4 fan-out."""
    span = spec.duration - spec.warmup
    subs = [r for i, r in enumerate(results) if i != 0]
    delivered = [r["recv"]["in_window"] / span for r in subs]
    pub = results[0]
    return {
        "publish_rate_target": spec.rate or None,
        "published_rate": pub["sent"]["in_window"] / span,
        "published": pub["sent"]["count"],
        "publisher_blocked": pub["sent"]["blocked"],
        "max_burst": pub["sent"]["max_burst"],
        "delivered_rate_min": min(delivered),
        "delivered_rate_mean": statistics.fmean(delivered),
        "undelivered": _undelivered(results, list(range(1, NODES)), [0]),
        "order_violations": sum(r["recv"]["order_violations"] for r in subs),
        "latency_ms": latency_ms(subs),
        "per_subscriber_ms": per_subscriber_ms(subs),
        "p99_halves_ms": [max(r["recv"]["p99_halves_us"][k] for r in subs) / 1000 for k in (0, 1)],
        "cpu_s": [r["cpu_s"] for r in results],
        "cpu_run_s": [r["cpu_run_s"] for r in results],
        "cpu_us_per_msg": {
            "publisher": 1e6 * pub["cpu_run_s"] / max(1, pub["sent"]["count"]),
            "subscriber": statistics.fmean(
                1e6 * r["cpu_run_s"] / max(1, r["recv"]["count"]) for r in subs
            ),
        },
        "sys_us_per_msg": {  # the kernel's part of the above (sockets, mostly)
            "publisher": 1e6 * pub.get("sys_run_s", 0.0) / max(1, pub["sent"]["count"]),
            "subscriber": statistics.fmean(
                1e6 * r.get("sys_run_s", 0.0) / max(1, r["recv"]["count"]) for r in subs
            ),
        },
        "cpu_percent": {
            "publisher": _cpu_percent([pub]),
            "subscriber": _cpu_percent(subs),
        },
        "peak_rss_mb": [r["peak_rss_mb"] for r in results],
        "gc_max_pause_ms": max(r["gc"]["max_ms"] for r in results),
        "stats": _stats(results),
    }


def hot_summary(spec: Spec, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Rates, loss, order and latency of the 5-publisher hot topic."""
    span = spec.duration - spec.warmup
    delivered = [r["recv"]["in_window"] / span for r in results]
    everyone = list(range(NODES))
    return {
        "publish_rate_target": spec.rate,
        "published_rate": [r["sent"]["in_window"] / span for r in results],
        "delivered_rate_min": min(delivered),
        "delivered_rate_mean": statistics.fmean(delivered),
        "expected_rate": spec.rate * (NODES - 1),
        "undelivered": _undelivered(results, everyone, everyone),
        "order_violations": sum(r["recv"]["order_violations"] for r in results),
        "latency_ms": latency_ms(results),
        "cpu_s": [r["cpu_s"] for r in results],
        "cpu_run_s": [r["cpu_run_s"] for r in results],
        "cpu_percent": _cpu_percent(results),
        "gc_max_pause_ms": max(r["gc"]["max_ms"] for r in results),
        "stats": _stats(results),
    }


def check_traces(specs: list[Spec], ids: list[str]) -> dict[str, Any]:
    """Causal order, FIFO and exactly-once on the merged traces of our nodes."""
    from p2p.sim import TraceEvent, check_trace, format_violations

    index = {int(h, 16): i for i, h in enumerate(ids)}
    events: list[TraceEvent] = []
    for spec in specs:
        with open(spec.trace, encoding="utf-8") as fh:
            for line in fh:
                t, event, source, seq = line.split()
                src = spec.index if source == "-" else index[int(source)]
                num = None if seq == "-" else int(seq)
                events.append(TraceEvent(float(t), spec.index, event, TOPIC, src, num))
    violations = check_trace(events, quiescent=True)
    # Liveness assumes the run drained; a backlog still queued at the end breaks it.
    late = [v for v in violations if v.kind in ("liveness", "own")]
    safety = [v for v in violations if v.kind not in ("liveness", "own")]
    return {
        "events": len(events),
        "deliveries": sum(e.event == "deliver" for e in events),
        "safety_violations": len(safety),
        "liveness_violations": len(late),
        "report": format_violations(violations),
    }


def spool_summary(specs: list[Spec], results: list[dict[str, Any]]) -> dict[str, Any]:
    """What our nodes' telemetry spools hold after a run: bytes, records, rates, and
    the counters of the benchmark's topic checked against what the harness counted.

    Every item is decoded and validated (``p2p.telemetry``); a bad one is counted
    in ``errors`` with its reason, never skipped silently.  Publications must
    match exactly.  A node records deliveries until it closes, after the harness
    stopped reading (at the end of the drain), so its count must lie between
    what the harness read and what the others published (equal when the run
    drained, ``undelivered`` 0).
    """
    import cbor2

    from p2p.telemetry import TelemetryError, iter_items, validate

    nodes = []
    published = sum(r["sent"]["count"] for r in results)
    for spec, res in zip(specs, results, strict=True):
        spool = Path(spec.telemetry_dir)
        files = sorted(spool.glob("*.cbor")) + sorted(spool.glob("*.part"))
        kinds = {"node": 0, "topic": 0, "event": 0}
        errors: list[str] = []
        counts = {"publications": 0, "deliveries": 0, "held": 0, "acked": 0}
        window_bytes, window, times = 0, 0.0, []
        for f in files:
            for item, err in iter_items(f.read_bytes()):
                try:
                    if err is not None:
                        raise TelemetryError(err)
                    rec = validate(item)
                except TelemetryError as exc:
                    errors.append(f"{f.name}: {exc}")
                    continue
                kinds[rec["kind"]] += 1
                times.append(rec["t"])
                if rec["kind"] == "event":
                    continue
                window = rec["window"]
                window_bytes += len(cbor2.dumps(rec))  # the bytes the recorder wrote
                if rec["kind"] == "topic" and rec["topic"] == TOPIC:
                    counts["publications"] += rec["publications"]
                    counts["deliveries"] += rec["deliveries"]
                    counts["held"] += rec["held"]
                    counts["acked"] += sum(rec["ack_round"])
        size = sum(f.stat().st_size for f in files)
        lifetime = max(times) - min(times) if times else 0.0
        expected = {
            "publications": res["sent"]["count"],
            "deliveries": res["recv"]["count"],
            "deliveries_max": published - res["sent"]["count"],
        }
        match = counts["publications"] == expected["publications"] and (
            expected["deliveries"] <= counts["deliveries"] <= expected["deliveries_max"]
        )
        per_window = window_bytes / (kinds["node"] * window) if kinds["node"] else None
        node: dict[str, Any] = {
            "bytes": size,
            "files": len(files),
            "records": kinds,
            "errors": len(errors),
            "error_sample": errors[:5],
            "lifetime_s": lifetime,
            "bytes_per_s": size / lifetime if lifetime else None,
            "window_s": window,
            "window_bytes_per_s": per_window,
            "counted": counts,
            "expected": expected,
            "counts_match": match,
        }
        nodes.append(node)
    steady = [n["window_bytes_per_s"] for n in nodes if n["window_bytes_per_s"] is not None]
    overall = [n["bytes_per_s"] for n in nodes if n["bytes_per_s"] is not None]
    return {
        "nodes": nodes,
        "window_bytes_per_s": _spread(steady),
        "bytes_per_s": _spread(overall),
        "bytes_per_node": _spread([n["bytes"] for n in nodes]),
        "errors": sum(n["errors"] for n in nodes),
        "counts_match": all(n["counts_match"] for n in nodes),
    }


def recorder_micro(repeat: int = 5, n: int = 20_000) -> dict[str, float]:
    """In-process cost of the recorder's calls, µs each (fastest of ``repeat`` loops of
    ``n`` calls, minus an empty call), and of one window's flush to disk."""
    from p2p.telemetry._recorder import Recorder, Spool

    def best(fn: Callable[[], object], calls: int) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append(time.perf_counter() - t0)
        return 1e6 * min(times) / calls

    with tempfile.TemporaryDirectory(prefix="bench-recorder-") as tmp:
        rec = Recorder(1, Spool(tmp))
        empty = best(lambda: None, n)
        out = {
            "published_us": best(partial(rec.published, TOPIC), n) - empty,
            "delivered_us": best(partial(rec.delivered, TOPIC, 3.2, 0.0), n) - empty,
            "delivered_held_us": best(partial(rec.delivered, TOPIC, 3.2, 1.5), n) - empty,
            "acked_us": best(partial(rec.acked_since, TOPIC, 1.012, [1.0]), n) - empty,
        }
        stats = {"packets_sent": 10, "frames_sent": 2, "bytes_sent": 1000}

        def window() -> None:
            rec.published(TOPIC)
            rec.flush(time.time(), stats, 4)

        out["flush_us"] = best(window, 200)
        rec.spool.close()
    return out


NODE_MICRO_ROUND = 16
"""Publications per round in :func:`node_micro` (a round's ACK times them all)."""


def node_micro(repeat: int = 7, rounds: int = 500) -> dict[str, float]:
    """What recording adds to the node's handling of core outputs, µs per message:
    one node (no peers) fed the outputs its core gives for ``rounds`` rounds of
    :data:`NODE_MICRO_ROUND` publications, with its recorder on and off (the
    fastest of ``repeat`` passes each, alternated).

    Subscriber: per round one batch of ``Received`` then ``Delivered`` per
    publication.  Publisher: per publication one batch of ``Published`` and its
    own ``Delivered`` (what ``publish`` hands over), per round one ``RoundAcked``.
    Sends are left out: they cost the same either way.
    """
    import trio

    from causal import MsgId
    from p2p.fleet import add_node, init_fleet
    from p2p.machine import ENVELOPE_SIZE
    from p2p.runtime import NodeConfig, open_node
    from p2p.runtime._delivery import _STAMP
    from p2p.telemetry._recorder import Recorder, Spool
    from topics import Delivered, Output, Published, Received, RoundAcked

    payload = bytes(ENVELOPE_SIZE) + _STAMP.pack(time.time()) + bytes(PAYLOAD_SIZE)
    ids = [MsgId(7, 1, i) for i in range(rounds * NODE_MICRO_ROUND)]
    batches = [ids[i : i + NODE_MICRO_ROUND] for i in range(0, len(ids), NODE_MICRO_ROUND)]
    sub_batches: list[list[Output]] = [
        [o for m in b for o in (Received(TOPIC, m, False), Delivered(TOPIC, m, payload))]
        for b in batches
    ]
    pub_batches: list[list[Output]] = [
        [Published(TOPIC, m), Delivered(TOPIC, m, payload, own=True)] for m in ids
    ]
    acks: list[list[Output]] = [[RoundAcked(TOPIC, "PUB", tuple(b))] for b in batches]

    async def run(root: Path) -> dict[str, float]:
        async with open_node(root / "node", NodeConfig(discovery=False, detector=False)) as node:
            sub = await node.subscribe(TOPIC)
            recorder = Recorder(node.id, Spool(root / "spool"), window=3600.0)

            def subscriber() -> None:
                for batch in sub_batches:
                    node._handle(batch, 1.0)
                    sub._queue.clear()

            def publisher() -> None:
                handle = node._handle
                for i, batch in enumerate(pub_batches):
                    handle(batch, 1.0)
                    if i % NODE_MICRO_ROUND == NODE_MICRO_ROUND - 1:
                        handle(acks[i // NODE_MICRO_ROUND], 1.002)
                sub._queue.clear()

            best: dict[str, float] = {}
            for _ in range(repeat):
                for on in (False, True):
                    node.recorder = recorder if on else None
                    for name, fn in (("subscriber", subscriber), ("publisher", publisher)):
                        t0 = time.perf_counter()
                        fn()
                        us = 1e6 * (time.perf_counter() - t0) / len(ids)
                        key = f"{name}_{'on' if on else 'off'}_us"
                        best[key] = min(best.get(key, us), us)
            node.recorder = None
            recorder.spool.close()
            return best

    with tempfile.TemporaryDirectory(prefix="bench-node-micro-") as tmp:
        root = Path(tmp)
        init_fleet(root / "fleet", psk=True, name="bench")
        add_node(root / "fleet", root / "node", name="bench0")
        out = trio.run(run, root)
    for name in ("subscriber", "publisher"):
        out[f"{name}_added_us"] = out[f"{name}_on_us"] - out[f"{name}_off_us"]
    return out


IMPORT_CODES = {
    "python": "pass",
    "ours": "from p2p import open_node",
    "ours_with_zeroconf": "from p2p import open_node; import zeroconf",
    "ours_package": "import p2p",
    "zmq": "import zmq",
    "zenoh": "import zenoh",
}
"""What ``import`` times: ``from p2p import open_node`` is what a trio application
writes (since issue 22 the runtime's names load lazily, so ``import p2p.runtime``
alone loads little; before, it loaded what ``open_node`` needs and
``BlockingNode``); ``import p2p`` alone loads no runtime at all."""


def import_times(repeat: int) -> dict[str, Any]:
    """Fastest of ``repeat`` wall times of ``python -c "import X"`` per library (the least
    disturbed by other load), and the same net of the bare interpreter's: with the
    workers' bytecode (:func:`use_bytecode_cache`), and, for ours, compiled from
    source every time (``source_net_s``: no ``.pyc`` of ours anywhere, as in an
    environment with ``PYTHONDONTWRITEBYTECODE=1``)."""
    source_env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    source_env["PYTHONDONTWRITEBYTECODE"] = "1"
    runs: dict[str, tuple[str, dict[str, str] | None]] = {
        key: (code, None) for key, code in IMPORT_CODES.items()
    }
    runs.update({f"source_{k}": (IMPORT_CODES[k], source_env) for k in ("python", "ours")})
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeat):
        for key, (code, env) in runs.items():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
            times[key].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    return {
        "wall_s": best,
        "net_s": {
            k: v - best["python"]
            for k, v in best.items()
            if k != "python" and not k.startswith("source_")
        },
        "source_net_s": {"ours": best["source_ours"] - best["source_python"]},
        "all_s": times,
    }


WARM_MODULES = (
    "p2p.runtime._node",
    "p2p.runtime._blocking",
    "zeroconf",
    "bench._runtime_workers",
    "psutil",
    "zmq",
    "zenoh",
)
"""What :func:`use_bytecode_cache` compiles before the first measurement."""


def use_bytecode_cache(cache: Path) -> None:
    """Make this process's children read and write bytecode in ``cache``, and fill it.

    An installed package has the ``.pyc`` files of its modules (``pip install``
    writes them), and so have the baselines' (compiled extensions, or pure-Python
    modules with their ``.pyc``); a checkout run with ``PYTHONDONTWRITEBYTECODE=1``
    compiles ours from source in every process.  So the workers and the import
    timings run with ``PYTHONPYCACHEPREFIX`` set to a cache of this run, compiled
    once here before anything is measured.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)
    code = (
        "import importlib, contextlib\n"
        f"for m in {WARM_MODULES!r}:\n"
        "    with contextlib.suppress(ImportError):\n"
        "        importlib.import_module(m)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def build_kind() -> dict[str, Any]:
    """Which build of the library runs (``p2p._build``: ``pure``, ``mypyc`` or
    ``mixed``), and the file each compiled-build module loads from."""
    from p2p import _build

    files = _build.origins()
    return {"kind": _build.build_kind(files), "modules": files}


# ----------------------------------------------------------------- the run


def run_all(bench: Bench, systems: Sequence[str], only: set[str]) -> dict[str, Any]:
    """Every workload on every system, system after system within each workload."""
    s = bench.s
    out: dict[str, dict[str, Any]] = {sys_: {} for sys_ in systems}

    def step(name: str, system: str, fn: Callable[[], Any]) -> Any:
        load = os.getloadavg()
        out[system].setdefault("loadavg", {}).setdefault(name, []).append(load[0])
        bench.say(f"  {name:<11} {system:<6} ... (load average {load[0]:.1f})")
        t0 = time.perf_counter()
        res = fn()
        bench.say(
            f"  {name:<11} {system:<6} {_brief(name, res)} ({time.perf_counter() - t0:.1f} s)"
        )
        return res

    for system in systems:
        if "cold" in only:
            out[system]["cold"] = step("cold", system, partial(bench.cold, system))
    if "cold" in only and "ours" in systems and s.cold_seeds:
        out["ours"]["cold_seeds"] = step("cold", "ours", partial(bench.cold, "ours", True))
    for system in systems:
        if "latency" in only:
            idle, lat = step("latency", system, partial(bench.latency, system))
            out[system]["idle"] = idle
            out[system]["latency_runs"] = [lat]
    if "latency" in only:
        for _ in range(1, s.latency_repeat):
            for system in systems:
                _, lat = step("latency", system, partial(bench.latency, system, False))
                out[system]["latency_runs"].append(lat)
        for system in systems:
            out[system]["latency"] = _median_run(out[system]["latency_runs"], ("latency_ms", "p99"))
        if "ours" in systems and s.cold_seeds:
            out["ours"]["idle_seeds"] = step("idle", "ours", bench.idle_seeds)
    if "throughput" in only:
        for _ in range(s.throughput_repeat):
            for system in systems:
                res = step("throughput", system, partial(bench.throughput, system))
                out[system].setdefault("throughput_runs", []).append(res)
        for system in systems:
            out[system]["throughput"] = _median_run(
                out[system]["throughput_runs"], ("delivered_rate_min",)
            )
        for system in systems if s.sustained_fraction else ():
            rate = s.sustained_fraction * out[system]["throughput"]["delivered_rate_min"]
            out[system]["sustained"] = step(
                "sustained", system, partial(bench.sustained, system, rate)
            )
        if "ours" in systems and s.traced_s:
            out["ours"]["traced"] = step("traced", "ours", bench.traced)
    for system in systems:
        if "hot" in only:
            out[system]["hot"] = step("hot", system, partial(bench.hot, system))
    if "preauth" in only and "ours" in systems:
        (bench.workdir / "preauth").mkdir()
        fn = partial(preauth.measure, bench.workdir / "preauth")
        out["ours"]["preauth"] = step("preauth", "ours", fn)
    if "telemetry" in only:
        runs: dict[str, list[dict[str, Any]]] = {"throughput": [], "latency": []}
        for i in range(s.telemetry_repeat):
            # off/on, then on/off: a load that drifts during the series weighs on both.
            modes = (False, True) if i % 2 == 0 else (True, False)
            for workload, done in runs.items():
                for on in modes:
                    fn = partial(bench.telemetry, workload, on)
                    done.append(step("telemetry", "ours", fn))
        bench.say("  telemetry  ours   recorder calls in-process ...")
        bench.say("  telemetry  ours   the node's handling of outputs in-process ...")
        out.setdefault("ours", {})["telemetry"] = telemetry_summary(
            runs, recorder_micro(), node_micro()
        )
    return out


TELEMETRY_METRICS: dict[str, dict[str, tuple[str, ...]]] = {
    "throughput": {
        "delivered_rate_min": ("delivered_rate_min",),
        "cpu_us_per_msg_publisher": ("cpu_us_per_msg", "publisher"),
        "cpu_us_per_msg_subscriber": ("cpu_us_per_msg", "subscriber"),
        "p99_ms": ("latency_ms", "p99"),
    },
    "latency": {
        "published_rate": ("published_rate",),
        "p50_ms": ("latency_ms", "p50"),
        "p99_ms": ("latency_ms", "p99"),
        "cpu_percent_publisher": ("cpu_percent", "publisher"),
        "cpu_percent_subscriber": ("cpu_percent", "subscriber"),
    },
}
"""What the ``telemetry`` workload compares, off against on, per workload."""


def telemetry_summary(
    runs: dict[str, list[dict[str, Any]]], micro: dict[str, float], node: dict[str, float]
) -> dict[str, Any]:
    """Off against on for each workload's runs (in the order they ran, in pairs), and
    what recording adds in-process (``node``, :func:`node_micro`) as a share of the
    CPU per message the fan-out runs spent with it off."""
    out: dict[str, Any] = {"recorder_us": micro, "node_us": node}
    spools = []
    for workload, done in runs.items():
        compare = {name: _compare(done, key) for name, key in TELEMETRY_METRICS[workload].items()}
        out[workload] = {"runs": done, "compare": compare}
        spools += [r["spool"] for r in done if r["telemetry"]]
    out["order"] = ["on" if r["telemetry"] else "off" for r in runs["throughput"]]
    out["loadavg"] = {
        mode: [r["loadavg"][0] for done in runs.values() for r in done if r["telemetry"] == on]
        for mode, on in (("off", False), ("on", True))
    }
    compare = out["throughput"]["compare"]
    out["node_share"] = {
        role: node[f"{role}_added_us"] / compare[f"cpu_us_per_msg_{role}"]["off_median"]
        for role in ("publisher", "subscriber")
        if compare[f"cpu_us_per_msg_{role}"]["off_median"]
    }
    nodes = [n for sp in spools for n in sp["nodes"]]
    steady = [n["window_bytes_per_s"] for n in nodes if n["window_bytes_per_s"] is not None]
    overall = [n["bytes_per_s"] for n in nodes if n["bytes_per_s"] is not None]
    out["spool"] = {
        "window_s": max((n["window_s"] for n in nodes), default=0.0),
        "window_bytes_per_s": _spread(steady),
        "bytes_per_s": _spread(overall),
        "bytes_per_node": _spread([n["bytes"] for n in nodes]),
        "records_per_node": _spread([sum(n["records"].values()) for n in nodes]),
        "deliveries": sum(n["counted"]["deliveries"] for n in nodes),
        "held": sum(n["counted"]["held"] for n in nodes),
        "errors": sum(sp["errors"] for sp in spools),
        "counts_match": all(sp["counts_match"] for sp in spools),
        "nodes": len(nodes),
    }
    return out


def _compare(runs: list[dict[str, Any]], key: tuple[str, ...]) -> dict[str, Any]:
    """``key`` (a path) with telemetry off and on: medians, their ratio, and the ratio
    within each pair of consecutive runs (the headline ``ratio`` is their median)."""

    def value(run: dict[str, Any]) -> float:
        v: Any = run
        for k in key:
            v = v[k]
        return float(v)

    off = [value(r) for r in runs if not r["telemetry"]]
    on = [value(r) for r in runs if r["telemetry"]]
    pair_ratios = []
    for i in range(0, len(runs) - 1, 2):
        a, b = runs[i], runs[i + 1]
        off_run, on_run = (b, a) if a["telemetry"] else (a, b)
        if value(off_run):
            pair_ratios.append(value(on_run) / value(off_run))
    off_med = statistics.median(off) if off else 0.0
    on_med = statistics.median(on) if on else 0.0
    return {
        "off": off,
        "on": on,
        "off_median": off_med,
        "on_median": on_med,
        "ratio_of_medians": on_med / off_med if off_med else None,
        "pair_ratios": pair_ratios,
        "ratio": statistics.median(pair_ratios) if pair_ratios else None,
    }


def _median_run(runs: list[dict[str, Any]], key: tuple[str, ...]) -> dict[str, Any]:
    """The run with the median value at ``key`` (a path), with every run's value beside it."""

    def value(run: dict[str, Any]) -> float:
        v: Any = run
        for k in key:
            v = v[k]
        return float(v)

    ordered = sorted(runs, key=value)
    median = dict(ordered[(len(ordered) - 1) // 2])
    median["median_of"] = {"key": ".".join(key), "values": [value(r) for r in runs]}
    return median


def _brief(name: str, res: Any) -> str:
    """One progress line for the result of workload ``name``."""
    if name == "cold":
        return f"first delivery {res['first_delivery_s']['max']:.2f} s after spawn"
    if name == "idle":
        return f"RSS {res['rss_mb']['max']:.1f} MB, idle CPU {res['cpu_percent']['max']:.1f} %"
    if name == "latency":
        idle, lat = res
        footprint = f"{_brief('idle', idle)}; " if idle else ""
        return (
            f"{footprint}{lat['published_rate']:.0f} msg/s p50 {lat['latency_ms']['p50']:.2f} "
            f"p99 {lat['latency_ms']['p99']:.2f} ms, undelivered {lat['undelivered']}"
        )
    if name == "preauth":
        return (
            f"peak RSS {res['idle_vmhwm_mb']:.1f} MB idle, +{res['grown_mb']:.1f} MB under "
            f"{res['junk_connections']} junk; delivered {res['delivered']}/{res['messages']}"
        )
    if name == "telemetry":
        spool = res.get("spool")
        tail = ""
        if spool is not None:
            tail = (f"; spool {spool['window_bytes_per_s']['median']:.0f} B/s per node, "
                    f"{spool['errors']} bad records, "
                    f"counts match: {spool['counts_match']}")  # fmt: skip
        rate = "" if res["publish_rate_target"] is None else " paced"
        return (
            f"telemetry {'on ' if res['telemetry'] else 'off'}{rate}: "
            f"{res['delivered_rate_min']:.0f} msg/s delivered, p50 "
            f"{res['latency_ms']['p50']:.2f} p99 {res['latency_ms']['p99']:.2f} ms, "
            f"undelivered {res['undelivered']}{tail}"
        )
    if name == "traced":
        check = res["trace_check"]
        return (
            f"{check['deliveries']} deliveries traced, {check['safety_violations']} safety "
            f"and {check['liveness_violations']} liveness violations, "
            f"undelivered {res['undelivered']}"
        )
    if name in ("throughput", "sustained"):
        return (
            f"{res['delivered_rate_min']:.0f} msg/s delivered (published "
            f"{res['published_rate']:.0f}), p99 {res['latency_ms']['p99']:.1f} ms, "
            f"undelivered {res['undelivered']}"
        )
    return (
        f"{res['delivered_rate_min']:.0f} msg/s per node, p99 {res['latency_ms']['p99']:.2f} ms, "
        f"undelivered {res['undelivered']}, order violations {res['order_violations']}"
    )


# ----------------------------------------------------------------- results


def ratios(res: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """``ours`` over each baseline, for the headline numbers."""
    ours = res.get("ours", {})
    out: dict[str, dict[str, float | None]] = {}
    for base in ("zmq", "zenoh"):
        other = res.get(base)
        if not ours or not other:
            continue
        pairs = {
            "throughput": lambda r: r["throughput"]["delivered_rate_min"],
            "latency_p99": lambda r: r["latency"]["latency_ms"]["p99"],
            "hot_p99": lambda r: r["hot"]["latency_ms"]["p99"],
            "idle_rss": lambda r: r["idle"]["rss_mb"]["max"],
            "first_delivery": lambda r: r["cold"]["first_delivery_s"]["max"],
        }
        out[f"ours/{base}"] = {k: _ratio(f, ours, other) for k, f in pairs.items()}
    return out


def _ratio(
    f: Callable[[dict[str, Any]], float], a: dict[str, Any], b: dict[str, Any]
) -> float | None:
    try:
        num, den = f(a), f(b)
    except KeyError:
        return None
    return num / den if den else None


def targets(res: dict[str, Any], imports: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The issue's three targets for ``ours``."""
    ours = res.get("ours", {})
    out = []
    if "idle" in ours:
        rss = ours["idle"]["rss_mb"]["max"]
        out.append({"target": f"idle RSS <= {TARGET_RSS_MB:g} MB per node", "value": rss,
                    "met": rss <= TARGET_RSS_MB})  # fmt: skip
    if "latency" in ours:
        p99 = ours["latency"]["latency_ms"]["p99"]
        out.append({"target": f"p99 at 1,000 msg/s fan-out <= {TARGET_P99_MS:g} ms",
                    "value": p99, "met": p99 <= TARGET_P99_MS})  # fmt: skip
    if "throughput" in ours and "throughput" in res.get("zenoh", {}):
        r = (
            ours["throughput"]["delivered_rate_min"]
            / res["zenoh"]["throughput"]["delivered_rate_min"]
        )
        out.append({"target": f"fan-out throughput >= {TARGET_TPUT_RATIO:g} x Zenoh's",
                    "value": r, "met": r >= TARGET_TPUT_RATIO})  # fmt: skip
    ratio = ours.get("telemetry", {}).get("throughput", {}).get("compare", {})
    ratio = ratio.get("delivered_rate_min", {}).get("ratio")
    if ratio is not None:
        out.append({"target": "telemetry on costs < 5 % of fan-out throughput "
                              "(median on/off ratio of the pairs)",
                    "value": ratio, "met": ratio >= TARGET_TELEMETRY_RATIO})  # fmt: skip
    return out


Row = tuple[str, Callable[[dict[str, Any]], float | str]]

ROWS: list[Row] = [
    ("fan-out max sustained, msg/s per subscriber",
     lambda r: r["throughput"]["delivered_rate_min"]),
    ("  each run", lambda r: " / ".join(
        f"{x / 1000:.1f}k" for x in r["throughput"]["median_of"]["values"])),
    ("  publisher blocked by flow control (times)", lambda r: r["throughput"]["publisher_blocked"]),
    ("  latency under saturation p50, ms", lambda r: r["throughput"]["latency_ms"]["p50"]),
    ("  latency under saturation p99, ms", lambda r: r["throughput"]["latency_ms"]["p99"]),
    ("  not delivered by the end (lost or late)", lambda r: r["throughput"]["undelivered"]),
    ("  CPU per message, us: publisher",
     lambda r: r["throughput"]["cpu_us_per_msg"]["publisher"]),
    ("  CPU per message, us: each subscriber",
     lambda r: r["throughput"]["cpu_us_per_msg"]["subscriber"]),
    ("    of which in the kernel, us: publisher / subscriber", lambda r: "{:.2f} / {:.2f}".format(
        r["throughput"]["sys_us_per_msg"]["publisher"],
        r["throughput"]["sys_us_per_msg"]["subscriber"])),
    ("sustained check: paced at 80 %, msg/s", lambda r: r["sustained"]["published_rate"]),
    ("  delivered, msg/s per subscriber", lambda r: r["sustained"]["delivered_rate_min"]),
    ("  p99, ms (1st half / 2nd half)",
     lambda r: "{:.2f} / {:.2f}".format(*r["sustained"]["p99_halves_ms"])),
    ("  not delivered by the end (lost or late)", lambda r: r["sustained"]["undelivered"]),
    ("  still queued in the publisher's core at the end",
     lambda r: r["sustained"]["stats"]["core_queued_at_end"]),
    ("traced fan-out, flat out: deliveries traced and checked",
     lambda r: r["traced"]["trace_check"]["deliveries"]),
    ("  causal/FIFO/exactly-once violations; not delivered by the end",
     lambda r: "{} / {}".format(r["traced"]["trace_check"]["safety_violations"],
                                r["traced"]["undelivered"])),
    ("fan-out @1,000 msg/s: achieved msg/s", lambda r: r["latency"]["published_rate"]),
    ("  latency p50, ms", lambda r: r["latency"]["latency_ms"]["p50"]),
    ("  latency p99, ms (median run)", lambda r: r["latency"]["latency_ms"]["p99"]),
    ("  p99 of each run, ms",
     lambda r: " / ".join(f"{x:.1f}" for x in r["latency"]["median_of"]["values"])),
    ("  latency max, ms", lambda r: r["latency"]["latency_ms"]["max"]),
    ("  not delivered by the end (lost or late)", lambda r: r["latency"]["undelivered"]),
    ("  CPU, % of a core: publisher", lambda r: r["latency"]["cpu_percent"]["publisher"]),
    ("  CPU, % of a core: each subscriber",
     lambda r: r["latency"]["cpu_percent"]["subscriber"]),
    ("hot topic 5 x 500 msg/s: delivered/s per node (min)",
     lambda r: r["hot"]["delivered_rate_min"]),
    ("  latency p50, ms", lambda r: r["hot"]["latency_ms"]["p50"]),
    ("  latency p99, ms", lambda r: r["hot"]["latency_ms"]["p99"]),
    ("  not delivered by the end (lost or late)", lambda r: r["hot"]["undelivered"]),
    ("  per-source FIFO violations", lambda r: r["hot"]["order_violations"]),
    ("  trace check: causal/FIFO/exactly-once violations",
     lambda r: r["hot"]["trace_check"]["safety_violations"]),
    ("  CPU per node, % of a core (mean)", lambda r: r["hot"]["cpu_percent"]),
    ("idle RSS per node, MB (max of 5)", lambda r: r["idle"]["rss_mb"]["max"]),
    ("idle USS per node, MB (max of 5)", lambda r: r["idle"]["uss_mb"]["max"]),
    ("idle CPU per node, % (max of 5)", lambda r: r["idle"]["cpu_percent"]["max"]),
    ("  idle RSS with static seeds, no mDNS, MB (max)",
     lambda r: r["idle_seeds"]["rss_mb"]["max"]),
    ("spawn -> first delivery, s (median / max)",
     lambda r: "{:.2f} / {:.2f}".format(r["cold"]["first_delivery_s"]["median"],
                                        r["cold"]["first_delivery_s"]["max"])),
    ("  spawn -> library imported, s (median)", lambda r: r["cold"]["imported_s"]["median"]),
    ("  spawn -> peers found, s (median)", lambda r: r["cold"]["up_s"]["median"]),
    ("  the same with static seeds, no mDNS (median / max)",
     lambda r: "{:.2f} / {:.2f}".format(r["cold_seeds"]["first_delivery_s"]["median"],
                                        r["cold_seeds"]["first_delivery_s"]["max"])),
]  # fmt: skip


def _cell(f: Callable[[dict[str, Any]], float | str], r: dict[str, Any]) -> str:
    """A table cell: ``f`` of one system's results, ``-`` when it was not measured."""
    try:
        v = f(r)
    except (KeyError, IndexError, TypeError):
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2f}"


def table(res: dict[str, Any], imports: dict[str, Any] | None, markdown: bool = False) -> str:
    """The results side by side, one column per system."""
    systems = [s for s in SYSTEMS if s in res]
    rows = [(name, [_cell(f, res[s]) for s in systems]) for name, f in ROWS]
    if imports:
        net = imports["net_s"]
        rows.append(("import time, ms (net of `python -c pass`)",
                     [f"{1000 * net[s]:.0f}" for s in systems]))  # fmt: skip
        rows.append(("  with zeroconf (what an mDNS node loads)",
                     [f"{1000 * net['ours_with_zeroconf']:.0f}" if s == "ours" else "-"
                      for s in systems]))  # fmt: skip
        if "ours_package" in net:
            rows.append(("  `import p2p` (the runtime loads on first use)",
                         [f"{1000 * net['ours_package']:.0f}" if s == "ours" else "-"
                          for s in systems]))  # fmt: skip
        source = imports.get("source_net_s", {})
        if "ours" in source:
            rows.append(("  compiled from source every time (no .pyc of ours)",
                         [f"{1000 * source['ours']:.0f}" if s == "ours" else "-"
                          for s in systems]))  # fmt: skip
    if markdown:
        lines = [
            "| workload | " + " | ".join(systems) + " |",
            "|---" + "|---:" * len(systems) + "|",
        ]
        for name, cells in rows:
            label = f"↳ {name.strip()}" if name.startswith("  ") else name
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        return "\n".join(lines)
    width = max(len(n) for n, _ in rows)
    cols = [max(len(s), *(len(cs[i]) for _, cs in rows)) + 2 for i, s in enumerate(systems)]
    head = f"{'':<{width}}" + "".join(f"{s:>{w}}" for s, w in zip(systems, cols, strict=True))
    body = [
        f"{n:<{width}}" + "".join(f"{c:>{w}}" for c, w in zip(cs, cols, strict=True))
        for n, cs in rows
    ]
    return "\n".join([head, *body])


TELEMETRY_ROWS: list[tuple[str, str, str, str]] = [
    ("fan-out max sustained, msg/s per subscriber", "throughput", "delivered_rate_min", ",.0f"),
    ("  CPU per message, us: publisher", "throughput", "cpu_us_per_msg_publisher", ".1f"),
    ("  CPU per message, us: each subscriber", "throughput", "cpu_us_per_msg_subscriber", ".1f"),
    ("  latency under saturation p99, ms", "throughput", "p99_ms", ",.0f"),
    ("fan-out @1,000 msg/s: achieved msg/s", "latency", "published_rate", ",.0f"),
    ("  latency p50, ms", "latency", "p50_ms", ".2f"),
    ("  latency p99, ms", "latency", "p99_ms", ".2f"),
    ("  CPU, % of a core: publisher", "latency", "cpu_percent_publisher", ".1f"),
    ("  CPU, % of a core: each subscriber", "latency", "cpu_percent_subscriber", ".1f"),
]
"""Label, workload, compared metric, number format of the ``telemetry`` table."""


def telemetry_table(tel: dict[str, Any], markdown: bool = False) -> str:
    """Telemetry off against on: medians, the median ratio of the pairs, every run."""
    rows: list[tuple[str, str, str, str]] = []
    for label, workload, metric, fmt in TELEMETRY_ROWS:
        c = tel[workload]["compare"][metric]
        ratio = "-" if c["ratio"] is None else f"{c['ratio']:.3f}"
        rows.append((label, format(c["off_median"], fmt), format(c["on_median"], fmt), ratio))
        if metric in ("delivered_rate_min", "p99_ms"):  # the noisy ones: every run
            rows.append(("    each run: " + label.strip(),
                         " / ".join(format(v, fmt) for v in c["off"]),
                         " / ".join(format(v, fmt) for v in c["on"]),
                         " / ".join(f"{r:.2f}" for r in c["pair_ratios"])))  # fmt: skip
    spool, us = tel["spool"], tel["recorder_us"]
    node: dict[str, float] = tel.get("node_us") or {}
    window = f"{spool['window_s']:g} s windows"
    rows += [
        (
            f"spool written per node, bytes/s ({window})",
            "-",
            f"{spool['window_bytes_per_s']['median']:.0f} (max "
            f"{spool['window_bytes_per_s']['max']:.0f})",
            "",
        ),
        (
            "  over each run, start and stop events included",
            "-",
            f"{spool['bytes_per_s']['median']:.0f} (max {spool['bytes_per_s']['max']:.0f})",
            "",
        ),
        (
            "  records per node per run (median)",
            "-",
            f"{spool['records_per_node']['median']:.0f}",
            "",
        ),
        (
            "  records failing validation; counters = harness counts",
            "-",
            f"{spool['errors']}; {'yes' if spool['counts_match'] else 'NO'}",
            "",
        ),
        (
            "  deliveries recorded as held back (held / deliveries)",
            "-",
            f"{spool['held']:,} / {spool['deliveries']:,}",
            "",
        ),
        (
            "recorder, us per call in-process: published / delivered / acked",
            "-",
            f"{us['published_us']:.2f} / {us['delivered_us']:.2f} / {us['acked_us']:.2f}",
            "",
        ),
        (
            "  one window's flush (node + topic record, CBOR, write), us",
            "-",
            f"{us['flush_us']:.0f}",
            "",
        ),
    ]
    for role in ("publisher", "subscriber") if node else ():  # none in older results
        share = 100 * tel["node_share"].get(role, 0.0)
        rows.append((f"node's output handling in-process, us/msg: {role}",
                     f"{node[f'{role}_off_us']:.2f}", f"{node[f'{role}_on_us']:.2f}",
                     f"+{node[f'{role}_added_us']:.2f} = {share:.1f} % of CPU/msg"))  # fmt: skip
    rows += [
        ("load average (1 min) at the runs' start: min-max (median)",
         _load_range(tel["loadavg"]["off"]), _load_range(tel["loadavg"]["on"]), ""),
    ]  # fmt: skip
    runs = len(tel["order"]) // 2
    head = (f"telemetry recording, ours ({runs} runs each way per workload, paired)",
            "off", "on", "on/off")  # fmt: skip
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|---|---:|---:|---:|"]
        for name, *cells in rows:
            label = f"↳ {name.strip()}" if name.startswith("  ") else name
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        return "\n".join(lines)
    aligned = [r for r in [head, *rows] if not r[0].startswith("    each run")]
    widths = [max(len(r[i]) for r in aligned) for i in range(4)]
    lines = [
        f"{r[0]:<{widths[0]}}"
        + "".join(f"  {c:>{w}}" for c, w in zip(r[1:], widths[1:], strict=True))
        for r in aligned
    ]
    lines.append(
        "runs in this order: " + ",".join(tel["order"]) + "; each run (off | on | on/off):"
    )
    for label, off, on, ratio in rows:
        if label.startswith("    each run"):
            lines.append(f"  {label.strip()}: {off} | {on} | {ratio}")
    return "\n".join(lines)


def _load_range(values: list[float]) -> str:
    """``min-max (median)`` of load averages."""
    if not values:
        return "-"
    return f"{min(values):.1f}-{max(values):.1f} ({statistics.median(values):.1f})"


def machine_info() -> dict[str, Any]:
    """The shared helper's fields plus CPU model, platform, load and library versions."""
    info = machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            info["cpu"] = next(
                (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), None
            )
    except OSError:
        info["cpu"] = None
    info["platform"] = platform.platform()
    info["loadavg_start"] = os.getloadavg()
    info["versions"] = _versions()
    info["build"] = build_kind()
    return info


def _versions() -> dict[str, str | None]:
    """Versions of the runtime's dependencies and of the baselines."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("trio", "cryptography", "cbor2", "zeroconf", "pyzmq", "eclipse-zenoh", "psutil"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    try:
        import zmq

        out["libzmq"] = str(zmq.zmq_version())
    except ImportError:
        out["libzmq"] = None
    return out


# ---------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m bench.runtime",
        description="Runtime benchmarks on loopback: ours beside ZeroMQ and Zenoh.",
    )
    p.add_argument("--quick", action="store_true", help="short smoke run (under a minute)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output ({DEFAULT_OUT})")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    p.add_argument(
        "--only",
        default="cold,latency,throughput,hot,import,preauth",
        help="comma-separated workloads (cold, latency [with idle], throughput "
        "[with sustained], hot, import, telemetry [ours with recording off and on; "
        "not in the default])",
    )
    p.add_argument(
        "--telemetry-repeat",
        type=int,
        metavar="N",
        help="telemetry: runs of each workload with recording off and N with it on "
        "(default 5, 1 with --quick)",
    )
    p.add_argument(
        "--telemetry-window",
        type=float,
        metavar="SECONDS",
        help="telemetry: seconds per telemetry window (default: the node's, 10)",
    )
    p.add_argument(
        "--bytecode",
        choices=("cached", "source"),
        default="cached",
        help="cached (default): every process reads bytecode compiled once for the run, as "
        "an installed package does; source: as the environment says (with "
        "PYTHONDONTWRITEBYTECODE=1, ours is compiled from source in every process)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run our nodes under cProfile, one DIR/<run>-<index>.prof per node",
    )
    return p


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM: unwind like Ctrl-C, so every worker is stopped on the way out."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workloads, print the table and targets, write the JSON; the exit status."""
    signal.signal(signal.SIGTERM, _terminate)
    args = build_parser().parse_args(argv)
    systems = [x.strip() for x in args.systems.split(",") if x.strip()]
    only = {x.strip() for x in args.only.split(",")}
    if unknown := set(systems) - set(SYSTEMS):
        print(f"unknown system(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if unknown := only - WORKLOADS:
        print(f"unknown workload(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if "telemetry" in only and "ours" not in systems:
        print("the telemetry workload measures ours: add it to --systems", file=sys.stderr)
        return 2
    settings = Settings.quick() if args.quick else Settings()
    if args.telemetry_repeat is not None:
        if args.telemetry_repeat < 1:
            print("--telemetry-repeat must be at least 1", file=sys.stderr)
            return 2
        settings = replace(settings, telemetry_repeat=args.telemetry_repeat)
    if args.telemetry_window is not None:
        if args.telemetry_window <= 0:
            print("--telemetry-window must be positive", file=sys.stderr)
            return 2
        settings = replace(settings, telemetry_window=args.telemetry_window)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        os.environ[PROFILE_ENV] = str(args.profile.resolve())
    started = time.perf_counter()
    info = machine_info()
    print(f"  build: {info['build']['kind']}", file=sys.stderr, flush=True)
    imports = None
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        if args.bytecode == "cached":
            use_bytecode_cache(Path(tmp) / "pycache")
        if "import" in only:
            print("  import times ...", file=sys.stderr, flush=True)
            imports = import_times(settings.import_repeat)
        bench = Bench(settings, Path(tmp))
        try:
            res = run_all(bench, systems, only)
        except KeyboardInterrupt:
            print("interrupted; workers killed", file=sys.stderr)
            return 130
        except BenchError as exc:
            print(f"benchmark failed: {exc}", file=sys.stderr)
            return 1
    if only - {"telemetry", "preauth"}:
        print(table(res, imports))
    pre = res.get("ours", {}).get("preauth")
    if pre is not None:
        print(
            f"preauth: peak RSS {pre['idle_vmhwm_mb']:.1f} MB idle, "
            f"{pre['attacked_vmhwm_mb']:.1f} MB under {pre['junk_connections']} junk "
            f"connections (+{pre['grown_mb']:.1f} MB); delivered "
            f"{pre['delivered']}/{pre['messages']}"
        )
    tel = res.get("ours", {}).get("telemetry")
    if tel is not None:
        print(telemetry_table(tel))
    tgt = targets(res, imports)
    for t in tgt:
        print(f"target {t['target']}: {t['value']:.2f} -> {'met' if t['met'] else 'NOT met'}")
    doc = {
        "benchmark": "runtime",
        "quick": args.quick,
        "total_s": time.perf_counter() - started,
        "machine": info,
        "discovery": "mDNS on 127.0.0.1 (ours); static TCP endpoints (zmq, zenoh)",
        "bytecode": args.bytecode,
        "settings": asdict(settings),
        "imports": imports,
        "results": res,
        "ratios": ratios(res),
        "targets": tgt,
        "table_markdown": (
            table(res, imports, markdown=True) if only - {"telemetry", "preauth"} else None
        ),
        "telemetry_table_markdown": telemetry_table(tel, markdown=True) if tel else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"results written to {args.out} ({doc['total_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

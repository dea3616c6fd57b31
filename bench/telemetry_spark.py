"""Telemetry at scale: generate a fleet's landing files, run the Spark job, report the cost.

A benchmark, not a test: it asserts nothing.  Run it from the repository
root (needs the ``spark`` extra, Java 17+, and ``psutil`` from ``bench``)::

    python -m bench.telemetry_spark                  # 1,000 devices x 24 h (~8.6 M records)
    python -m bench.telemetry_spark --quick          # 50 devices x 6 h, a smoke run
    python -m bench.telemetry_spark --reuse          # skip generation if the data is there

Steps: ``p2p telemetry generate`` in-process (timed; one worker per core),
then ``p2p telemetry aggregate`` in a child process, whose whole process
tree (the Python driver, the JVM, the Python workers) is sampled every
0.5 s by a thread: the peak of the summed RSS (an upper bound: forked
workers share pages) and of the summed PSS (shared pages split between
their users: what the job really holds) are reported, with the peak per
part.  Records/s is items read over the job's wall time, JVM start
included; the decode stage's own rate is reported too.  The load average
before and after is recorded: on a shared machine other work slows the run,
so the CPU seconds the job's processes used (sampled with the memory) are
reported as well: records per CPU-second does not depend on other load.

Generated data goes under ``--data`` (default ``/tmp/p2p-telemetry-bench``),
never into the repository; the numbers go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench._common import ROOT, machine

DEFAULT_OUT = ROOT / "bench" / "results" / "telemetry_spark.json"
QUICK_OUT = ROOT / "bench" / "out" / "telemetry_spark_quick.json"


class TreeSampler:
    """Peak memory of a process and all its descendants, sampled in a thread."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_parts: dict[str, int] = {}
        self.samples = 0
        self.max_processes = 0
        self.cpu: dict[int, float] = {}
        """Latest user + system CPU seconds of every process seen (exited ones keep theirs)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @staticmethod
    def _part(proc: Any) -> str:
        try:
            name = proc.name()
            cmd = " ".join(proc.cmdline())
        except Exception:
            return "other"
        if "java" in name:
            return "jvm"
        if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
            return "python_workers"
        if "p2p.telemetry" in cmd:
            return "driver_python"
        return "other"

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            rss = pss = 0
            parts: dict[str, int] = {}
            for proc in procs:
                try:
                    info = proc.memory_full_info()
                    times = proc.cpu_times()
                except psutil.Error:
                    continue
                self.cpu[proc.pid] = times.user + times.system
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
                part = self._part(proc)
                parts[part] = parts.get(part, 0) + getattr(info, "pss", info.rss)
            self.samples += 1
            self.max_processes = max(self.max_processes, len(procs))
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            for part, value in parts.items():
                self.peak_parts[part] = max(self.peak_parts.get(part, 0), value)
            self._stop.wait(self.interval)


def _mb(n: float) -> float:
    return round(n / 1e6, 1)


def generate_data(args: argparse.Namespace) -> dict[str, Any]:
    from p2p.telemetry._generate import generate

    data = Path(args.data)
    marker = data / "_bench.json"
    wanted = {"devices": args.devices, "hours": args.hours, "seed": args.seed}
    if args.reuse and marker.is_file():
        previous = json.loads(marker.read_text())
        if previous.get("params") == wanted:
            print(f"reusing {data} (generated in {previous['seconds']:.1f} s)", file=sys.stderr)
            return dict(previous["stats"], reused=True)
    if data.exists():
        shutil.rmtree(data)
    print(f"generating {args.devices} devices x {args.hours} h into {data} ...", file=sys.stderr)
    started = time.perf_counter()
    stats = generate(
        data,
        devices=args.devices,
        hours=args.hours,
        seed=args.seed,
        progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True),
    )
    seconds = time.perf_counter() - started
    stats["records_per_s"] = round(stats["records"] / seconds, 1)
    marker.write_text(json.dumps({"params": wanted, "seconds": seconds, "stats": stats}))
    return stats


def run_job(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.job_out)
    if out.exists():
        shutil.rmtree(out)
    cmd = [
        sys.executable,
        "-m",
        "p2p.telemetry._cli",
        "telemetry",
        "aggregate",
        str(args.data),
        "--out",
        str(out),
        "--master",
        args.master,
        "--driver-memory",
        args.driver_memory,
    ]
    print("running: " + " ".join(cmd), file=sys.stderr, flush=True)
    load_before = os.getloadavg()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    with TreeSampler(proc.pid) as sampler:
        code = proc.wait()
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"the job failed with exit status {code}")
    summary = json.loads((out / "summary.json").read_text())
    timings = summary["timings_s"]
    return {
        "command": " ".join(cmd[1:]),
        "wall_s": round(wall, 2),
        "timings_s": timings,
        "records_read": summary["records_read"],
        "aggregated": summary["aggregated"],
        "quarantined": summary["quarantined"],
        "by_reason": summary["by_reason"],
        "duplicates_dropped": summary["duplicates_dropped"],
        "files": summary["files"],
        "bytes": summary["bytes"],
        "decode_tasks": summary["spark"]["tasks"],
        "spark_version": summary["spark"]["version"],
        "rows": summary["rows"],
        "records_per_s": round(summary["records_read"] / wall, 1),
        "cpu_s": round(sum(sampler.cpu.values()), 1),
        "records_per_cpu_s": round(summary["records_read"] / max(sum(sampler.cpu.values()), 1e-9)),
        "decode_records_per_s": round(summary["records_read"] / timings["decode"], 1),
        "peak_memory_mb": {
            "pss_total": _mb(sampler.peak_pss),
            "rss_total": _mb(sampler.peak_rss),
            **{f"pss_{k}": _mb(v) for k, v in sorted(sampler.peak_parts.items())},
        },
        "memory_samples": sampler.samples,
        "max_processes": sampler.max_processes,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="50 devices x 6 h")
    parser.add_argument("--data", default="/tmp/p2p-telemetry-bench", help="landing dir")
    parser.add_argument("--job-out", default="/tmp/p2p-telemetry-bench-out", help="job OUT_DIR")
    parser.add_argument("--reuse", action="store_true", help="reuse --data if it matches")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--out", type=Path, help=f"results JSON (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    if args.quick:
        args.devices, args.hours = 50, 6.0
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    load = os.getloadavg()
    gen = generate_data(args)
    job = run_job(args)
    result = {
        "benchmark": "telemetry_spark",
        "params": {
            "devices": args.devices,
            "hours": args.hours,
            "seed": args.seed,
            "master": args.master,
            "driver_memory": args.driver_memory,
        },
        "machine": {**machine(), "memory_gb": _memory_gb(), "load_average_at_start": load},
        "generate": {
            k: gen[k]
            for k in ("records", "files", "bytes", "seconds", "records_per_s", "reused")
            if k in gen
        },
        "job": job,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    peak = job["peak_memory_mb"]
    print(
        f"\ngenerate: {gen['records']:,} records, {gen['bytes'] / 1e9:.2f} GB in "
        f"{gen.get('seconds', 0):.1f} s ({gen.get('records_per_s', 0):,.0f} records/s)\n"
        f"job:      {job['records_read']:,} records in {job['wall_s']:.1f} s: "
        f"{job['records_per_s']:,.0f} records/s (decode stage "
        f"{job['decode_records_per_s']:,.0f}/s); peak memory {peak['pss_total']:,.0f} MB PSS "
        f"({peak['rss_total']:,.0f} MB RSS summed); {job['cpu_s']:,.0f} CPU-s, "
        f"{job['records_per_cpu_s']:,} records per CPU-second\nresults in {out}"
    )
    return 0


def _memory_gb() -> float | None:
    try:
        import psutil

        total: int = psutil.virtual_memory().total
        return round(total / 2**30, 1)
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())

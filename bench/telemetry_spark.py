"""Telemetry at scale: the Spark job against one plain Python process, on the same landing.

A benchmark, not a test: it asserts nothing.  Run it from the repository
root (needs the ``spark`` extra, Java 17+, and ``psutil`` from ``bench``)::

    python -m bench.telemetry_spark                     # ~1 M and ~8.6 M records, local + cluster
    python -m bench.telemetry_spark --sizes 1m --modes local     # one cell
    python -m bench.telemetry_spark --quick             # 50 devices x 6 h, a smoke run

For each size (``1m``: 120 devices x 24 h; ``8.6m``: 1,000 devices x
24 h) the landing is generated once under ``--data`` (reused when its
parameters match), then, in this one invocation and on that landing:

* **baseline**: one plain Python process (:func:`baseline`, below): cbor2
  decode of every spool file, dedupe by ``id``, per-device counts,
  per-topic sums and latency histograms.  What a user would write in an
  afternoon, with no validation and no quarantine.
* **local**: ``p2p telemetry aggregate --master local[*]`` (a child process).
* **standalone**: the same against a real standalone master with two
  1-core workers started here as local processes (127.0.0.1).
* **decode + validate per core**: the job's task code without Spark on a
  sample of the files, one process: ``scan`` + the batch check, and
  ``scan`` + ``validate`` per item (the path before the batch check).

Each run's process tree (for the cluster: the master, workers, executors
and their Python workers too) is sampled every 0.5 s for peak memory (PSS
summed; RSS summed as an upper bound) and CPU seconds.  Records/s is items
read over wall time, JVM start included; ``ratio_to_baseline`` is that
over the baseline's rate from the same invocation.  ``fixed_s`` is
everything but the decode stage (Spark start, listing, writes, report).
The load average before and after each run is recorded: the machine may be
shared.  Results go to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench._common import ROOT, machine

DEFAULT_OUT = ROOT / "bench" / "results" / "telemetry_spark.json"
QUICK_OUT = ROOT / "bench" / "out" / "telemetry_spark_quick.json"
SIZES = {"1m": (120, 24.0), "8.6m": (1000, 24.0)}


class TreeSampler:
    """Peak memory of a process and all its descendants, sampled in a thread."""

    def __init__(self, pids: list[int], interval: float = 0.5) -> None:
        import psutil

        self.roots = [psutil.Process(pid) for pid in pids]
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
        if "bench.telemetry_spark" in cmd:
            return "baseline"
        return "other"

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            procs = []
            for root in self.roots:
                try:
                    procs += [root, *root.children(recursive=True)]
                except psutil.Error:
                    continue
            if not procs:
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


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def generate_data(data: Path, devices: int, hours: float, seed: int) -> dict[str, Any]:
    """The landing for one size, generated unless ``data`` already holds it."""
    from p2p.telemetry._generate import generate

    marker = data / "_bench.json"
    wanted = {"devices": devices, "hours": hours, "seed": seed}
    if marker.is_file():
        previous = json.loads(marker.read_text())
        if previous.get("params") == wanted:
            print(f"reusing {data}", file=sys.stderr)
            return dict(previous["stats"], reused=True)
    if data.exists():
        shutil.rmtree(data)
    print(f"generating {devices} devices x {hours} h into {data} ...", file=sys.stderr)
    started = time.perf_counter()
    stats = generate(data, devices=devices, hours=hours, seed=seed, progress=None)
    seconds = time.perf_counter() - started
    stats["records_per_s"] = round(stats["records"] / seconds, 1)
    marker.write_text(json.dumps({"params": wanted, "seconds": seconds, "stats": stats}))
    return stats


# ------------------------------------------------------------------ baseline


def baseline(landing: str) -> dict[str, Any]:
    """The single-process baseline: decode, dedupe by id, count and sum.  No validation."""
    import cbor2

    seen: set[str] = set()
    per_device: Counter[str] = Counter()
    topics: dict[str, list[Any]] = {}
    items = 0
    for path in sorted(Path(landing).glob("date=*/device=*/*.cbor")):
        data = path.read_bytes()
        stream = io.BytesIO(data)
        decoder = cbor2.CBORDecoder(stream)
        while stream.tell() < len(data):
            try:
                rec = decoder.decode()
            except Exception:  # a torn or corrupt file: keep what came before
                break
            items += 1
            try:
                rid = rec["id"]
                if rid in seen:
                    continue
                seen.add(rid)
                per_device[rec["device"]] += 1
                if rec["kind"] == "topic":
                    t = topics.get(rec["topic"])
                    if t is None:
                        t = topics[rec["topic"]] = [0, 0, [0] * len(rec["latency"])]
                    t[0] += rec["publications"]
                    t[1] += rec["deliveries"]
                    t[2] = [a + b for a, b in zip(t[2], rec["latency"], strict=True)]
            except (KeyError, TypeError, ValueError):  # a bad record: skip it
                continue
    return {"items": items, "kept": len(seen), "devices": len(per_device), "topics": len(topics)}


def _baseline_main(landing: str, out: str) -> int:
    started = time.perf_counter()
    result = baseline(landing)
    result["seconds"] = time.perf_counter() - started
    Path(out).write_text(json.dumps(result))
    return 0


def run_baseline(landing: Path, work: Path) -> dict[str, Any]:
    out = work / "baseline.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.telemetry_spark",
        "--baseline-of",
        str(landing),
        "--baseline-out",
        str(out),
    ]
    load = _load()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    with TreeSampler([proc.pid]) as sampler:
        code = proc.wait()
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"the baseline failed with exit status {code}")
    res = json.loads(out.read_text())
    return {
        **res,
        "wall_s": round(wall, 2),
        "records_per_s": round(res["items"] / wall, 1),
        "records_per_s_excluding_start": round(res["items"] / res["seconds"], 1),
        "peak_memory_mb": {"pss_total": _mb(sampler.peak_pss), "rss_total": _mb(sampler.peak_rss)},
        "cpu_s": round(sum(sampler.cpu.values()), 1),
        "load_average_before": load,
        "load_average_after": _load(),
    }


# ----------------------------------------------------------------------- job


def run_job(
    landing: Path, out: Path, master: str, extra_pids: tuple[int, ...], driver_memory: str
) -> dict[str, Any]:
    if out.exists():
        shutil.rmtree(out)
    cmd = [
        sys.executable,
        "-m",
        "p2p.telemetry._cli",
        "telemetry",
        "aggregate",
        str(landing),
        "--out",
        str(out),
        "--master",
        master,
        "--driver-memory",
        driver_memory,
    ]
    print("running: " + " ".join(cmd[2:]), file=sys.stderr, flush=True)
    # Executors run this interpreter (local mode does so anyway): a cluster whose workers
    # have the spark extra installed, numba included.
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    load = _load()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    with TreeSampler([proc.pid, *extra_pids]) as sampler:
        code = proc.wait()
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"the job failed with exit status {code}")
    summary = json.loads((out / "summary.json").read_text())
    timings = summary["timings_s"]
    cpu = sum(sampler.cpu.values())
    return {
        "master": master,
        "wall_s": round(wall, 2),
        "timings_s": timings,
        "fixed_s": round(wall - timings["decode"], 2),
        "records_read": summary["records_read"],
        "aggregated": summary["aggregated"],
        "compiled_path": summary.get("compiled_path"),
        "decode_tasks_wall_s": summary.get("decode_tasks_wall_s"),
        "decode_tasks_cpu_s": summary.get("decode_tasks_cpu_s"),
        "tables_written_by": summary.get("tables_written_by"),
        "quarantined": summary["quarantined"],
        "by_reason": summary["by_reason"],
        "duplicates_dropped": summary["duplicates_dropped"],
        "files": summary["files"],
        "bytes": summary["bytes"],
        "decode_tasks": summary["spark"]["tasks"],
        "spark_version": summary["spark"]["version"],
        "rows": summary["rows"],
        "records_per_s": round(summary["records_read"] / wall, 1),
        "decode_records_per_s": round(summary["records_read"] / timings["decode"], 1),
        "cpu_s": round(cpu, 1),
        "records_per_cpu_s": round(summary["records_read"] / max(cpu, 1e-9)),
        "peak_memory_mb": {
            "pss_total": _mb(sampler.peak_pss),
            "rss_total": _mb(sampler.peak_rss),
            **{f"pss_{k}": _mb(v) for k, v in sorted(sampler.peak_parts.items())},
        },
        "max_processes": sampler.max_processes,
        "load_average_before": load,
        "load_average_after": _load(),
    }


@contextmanager
def _cluster(mode: str) -> Iterator[tuple[str, tuple[int, ...]]]:
    if mode == "local":
        yield "local[*]", ()
        return
    from p2p.telemetry._standalone import standalone_cluster

    with standalone_cluster(workers=2, cores=1, memory="1500m") as cluster:
        yield cluster.url, cluster.pids


# ------------------------------------------------------------ task rates


def task_rates(landing: Path, budget: int = 48 << 20) -> dict[str, Any]:
    """Per core, the job's own code without Spark, on files spread over the landing
    (``budget`` bytes in all), each path timed twice in alternation (best of two kept):

    * ``records_per_s_per_core``: decode + validate only: the compiled parser (items it
      leaves take cbor2 + the batch check), cbor2 + the batch check, cbor2 + ``validate``
      per item;
    * ``task_records_per_s_per_core``: the whole decode task (decode, validate, dedupe,
      fold into the partials) with the compiled path and with the batch path.
    """
    from p2p.telemetry._job import list_landing

    found, _, _ = list_landing(str(landing))
    total = sum(f.size for f in found)
    step = max(1, round(total / budget))
    sample = [(f, Path(f.path).read_bytes()) for f in found[::step]]
    blobs = [blob for _, blob in sample]
    runs: dict[str, Any] = {
        "compiled": lambda: _decode_compiled(sample),
        "batch": lambda: _decode_exact(blobs, True),
        "validate_each": lambda: _decode_exact(blobs, False),
        "task_compiled": lambda: _whole_task(sample, True),
        "task_batch": lambda: _whole_task(sample, False),
    }
    best: dict[str, float] = {}
    items = 0
    for _ in range(2):
        for key, body in runs.items():
            started = time.process_time()
            items = body()
            rate = items / max(time.process_time() - started, 1e-9)
            best[key] = max(best.get(key, 0.0), rate)
    decode = ("compiled", "batch", "validate_each")
    return {
        "items": items,
        "files": len(blobs),
        "clock": "CPU time of this process",
        "records_per_s_per_core": {k: round(best[k], 1) for k in decode},
        "task_records_per_s_per_core": {
            "compiled": round(best["task_compiled"], 1),
            "batch": round(best["task_batch"], 1),
        },
        "speedup_compiled_vs_batch": round(best["compiled"] / best["batch"], 2),
        "speedup_batch_vs_validate_each": round(best["batch"] / best["validate_each"], 2),
    }


def _decode_exact(blobs: list[bytes], batch: bool) -> int:
    from p2p.telemetry._batch import Checker, check_file
    from p2p.telemetry._job import scan

    checker, items = Checker(), 0
    for blob in blobs:
        scanned = list(scan(blob))
        check_file(checker, blob, scanned, batch)
        items += len(scanned)
    return items


def _decode_compiled(sample: list[tuple[Any, bytes]]) -> int:
    """The compiled parser over each file; an item it leaves is decoded and checked
    exactly (cbor2 + the batch check), as the task does."""
    import numpy as np

    from p2p.telemetry._batch import Checker, check_file
    from p2p.telemetry._fast import RUN, Parser
    from p2p.telemetry._job import scan

    parser, checker, items = Parser(), Checker(), 0
    for lf, blob in sample:
        buf, pos = np.frombuffer(blob, dtype=np.uint8), 0
        while pos < len(blob):
            count, pos = parser.run(buf, pos, lf.device)
            items += count
            if pos >= len(blob) or count == RUN:
                continue
            item = next(scan(blob, pos))
            check_file(checker, blob, [item])
            items += 1
            pos = item[1]
    return items


def _whole_task(sample: list[tuple[Any, bytes]], compiled: bool) -> int:
    from p2p.telemetry._task import _Task, _TaskConfig

    task = _Task(_TaskConfig(None, None, 3600.0, True, compiled))
    items = sum(task.device(lf.device, [(lf, blob)]) for lf, blob in sample)
    for _ in task.output():
        pass
    return items


def numba_compile() -> dict[str, Any]:
    """Seconds to import and compile the parser in a fresh process with an empty numba
    cache (what a cluster worker pays once), and with the cache the runs here use."""
    import tempfile

    code = (
        "import time; t = time.perf_counter(); import numpy as np; "
        "from p2p.telemetry._fast import Parser; p = Parser(); "
        "p.run(np.frombuffer(b'x', dtype=np.uint8), 0, '0' * 16); p.digest(b'x', 0, 1); "
        "print(time.perf_counter() - t)"
    )
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as cache:
        for label, env in (("cold_s", {"NUMBA_CACHE_DIR": cache}), ("cached_s", {})):
            res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                                 text=True, env={**os.environ, **env}, check=True)  # fmt: skip
            out[label] = round(float(res.stdout.strip()), 2)
    return out


# --------------------------------------------------------------------- main


def one_size(args: argparse.Namespace, label: str, devices: int, hours: float) -> dict[str, Any]:
    data = Path(args.data) / f"d{devices}h{hours:g}"
    gen = generate_data(data, devices, hours, args.seed)
    work = Path(args.data) / "work"
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {
        "devices": devices,
        "hours": hours,
        "generate": {k: gen[k] for k in ("records", "files", "bytes", "reused") if k in gen},
        "numba_compile": numba_compile(),
        "task_rates": task_rates(data),
    }
    print(f"[{label}] compile: {res['numba_compile']}", file=sys.stderr)
    print(f"[{label}] decode+validate per core: {res['task_rates']}", file=sys.stderr)
    res["baseline"] = base = run_baseline(data, work)
    print(f"[{label}] baseline: {base['records_per_s']:,.0f} records/s", file=sys.stderr)
    for mode in args.modes.split(","):
        with _cluster(mode) as (master, pids):
            job = run_job(data, work / f"out-{mode}", master, pids, args.driver_memory)
        job["ratio_to_baseline"] = round(job["records_per_s"] / base["records_per_s"], 2)
        # Per CPU-second too: less sensitive to what else runs on a shared machine.
        # (None when the baseline was too short for the 0.5 s sampler to see its CPU.)
        base_cpu = base["cpu_s"]
        job["cpu_ratio_to_baseline"] = (
            round(job["records_per_cpu_s"] * base_cpu / base["items"], 2) if base_cpu else None
        )
        res[mode] = job
        print(
            f"[{label}] {mode}: {job['records_per_s']:,.0f} records/s, "
            f"{job['ratio_to_baseline']}x baseline, fixed {job['fixed_s']} s, "
            f"peak {job['peak_memory_mb']['pss_total']:,.0f} MB PSS",
            file=sys.stderr,
        )
    modes = args.modes.split(",")
    if "local" in modes:
        for mode in modes:
            if mode != "local":
                same = same_tables(work / "out-local", work / f"out-{mode}")
                res[mode]["same_tables_as_local"] = same
                print(f"[{label}] {mode}: same tables as local mode: {same}", file=sys.stderr)
    return res


def same_tables(a: Path, b: Path) -> dict[str, bool]:
    """Whether two runs wrote equal tables, table by table (every row, every field, in
    order; read with pyarrow)."""
    import importlib

    from p2p.telemetry._tables import TABLES

    pq: Any = importlib.import_module("pyarrow.parquet")
    return {name: pq.read_table(a / name).to_pylist() == pq.read_table(b / name).to_pylist()
            for name in TABLES}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1m,8.6m", help="comma-separated: " + ", ".join(SIZES))
    parser.add_argument("--modes", default="local,standalone")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="50 devices x 6 h, local only")
    parser.add_argument("--data", default="/tmp/p2p-telemetry-bench", help="landing dirs")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--out", type=Path, help=f"results JSON (default {DEFAULT_OUT})")
    parser.add_argument("--baseline-of", help=argparse.SUPPRESS)
    parser.add_argument("--baseline-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.baseline_of:
        return _baseline_main(args.baseline_of, args.baseline_out)
    sizes = {"quick": (50, 6.0)} if args.quick else {}
    for label in [] if args.quick else args.sizes.split(","):
        if label not in SIZES:
            parser.error(f"unknown size {label!r} (choose from {', '.join(SIZES)})")
        sizes[label] = SIZES[label]
    if args.quick:
        args.modes = "local"
    out = args.out or (QUICK_OUT if args.quick else DEFAULT_OUT)
    result: dict[str, Any] = {
        "benchmark": "telemetry_spark",
        "machine": {**machine(), "memory_gb": _memory_gb(), "load_average_at_start": _load()},
        "params": {"seed": args.seed, "modes": args.modes, "driver_memory": args.driver_memory},
        "sizes": {},
    }
    for label, (devices, hours) in sizes.items():
        result["sizes"][label] = one_size(args, label, devices, hours)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    result["machine"]["load_average_at_end"] = _load()
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results in {out}", file=sys.stderr)
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

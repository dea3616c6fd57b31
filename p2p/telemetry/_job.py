"""The Spark job: ``p2p telemetry aggregate LANDING_DIR --out OUT_DIR``.

Reads the landing files (layout in :mod:`p2p.telemetry`), decodes and
validates every record on the executors, and writes Parquet tables, a
quarantine of the bad records, ``summary.json`` and ``report.html``.
PySpark is imported only inside this module's functions: devices never need
it (it is the ``spark`` extra).

How it runs (stage lines and progress go to stderr):

1. **List** the landing files on the driver: ``os.walk`` for a local or
   shared path, the Hadoop ``FileSystem`` for a URI (``hdfs://``, ``s3a://``).
   Names starting with ``_`` or ``.`` (the collector's ``_incoming``) and
   ``*.tmp`` files are ignored; other files outside the layout are counted
   and listed in the summary as skipped.  With ``--since``, ``date=`` folders
   more than a day before it are not read (a landing file only holds records
   from its day or before it, whichever day a collector files them under).
2. **Decode** on the executors (:mod:`p2p.telemetry._task`).  All files of
   a device go to the same task (devices are spread over tasks by bytes), so
   duplicates (same ``id``, i.e. same device, boot and seq) are dropped
   there: the first in (date, file name, offset) order is kept.  Node and
   topic records are read by a compiled parser where numba is installed
   (:mod:`p2p.telemetry._fast`), which hands every item it cannot decide
   exactly to the exact path: cbor2, then a batch check per file
   (:mod:`p2p.telemetry._batch`); both give exactly
   :func:`~p2p.telemetry.validate`'s verdicts.  A record whose ``device`` is
   not its folder's is *misplaced*.  Bad items go to the quarantine, never
   crash the job.  Each task folds its records into partial aggregates (per
   device, per (window, topic), per window, per topic) and hands only those,
   the events and the quarantine rows back.  For a URI the files are read
   with ``binaryFiles`` and grouped by device with a shuffle.
3. **Aggregate** on the driver (:mod:`p2p.telemetry._tables`): the partials
   are a few per key and task, so they are collected in the decode job and
   merged in memory (counters add, histograms add element-wise); then
   percentiles come from the merged histograms
   (:func:`~p2p.telemetry.percentile`) and topics are ranked.
4. **Write** the tables from the driver's rows, with pyarrow (without it,
   one Spark write of local rows each): Parquet, one file per folder under
   ``OUT_DIR``, rows in the order below:

   ``devices``     one row per device: records by kind, boots, first/last
                   seen, RSS mean/max, CPU, connections, packets, frames, bytes,
                   suspicions, repairs, rejected, dropped, publications,
                   deliveries, crashes, starts, duplicates, quarantined
   ``topics``      one row per topic: ``hot_rank`` (1 = most publications),
                   counters, rates per second over the data's span, latency,
                   hold-back and ACK-round p50/p95/p99 (ms) and the merged
                   histograms
   ``windows``     one row per (time window, topic): the same per window
   ``fleet``       one row per time window: devices reporting, records,
                   rates, latency percentiles, resource use, event counts
   ``timeline``    every event record, ordered by time (crash, start, stop,
                   suspect, unsuspect, repair, join, leave, spool_dropped)
   ``quarantine``  one row per bad item: file, byte offset, reason, field,
                   error, the first 64 bytes in hex

   plus ``summary.json`` (counts, by reason, timings) and ``report.html``,
   drawn from the same rows in memory (:mod:`p2p.telemetry._report`).

A run that read no item, or kept none, still writes all that and then fails
(:class:`~p2p.telemetry.TelemetryError`) with the first quarantine reasons.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2p.telemetry._accum import window_start
from p2p.telemetry._generate import parse_time
from p2p.telemetry._listing import (
    LAYOUT,
    REASONS,
    LandingFile,
    _list_uri,
    classify,
    list_landing,
    scan,
    spread,
)
from p2p.telemetry._report import write_report
from p2p.telemetry._schema import TelemetryError
from p2p.telemetry._spark import (
    SPARK_MISSING,
    absolute,
    is_uri,
    local_path,
    require_pyspark,
    scheme,
    spark_session,
    write_text,
)
from p2p.telemetry._tables import TABLES, _schemas, merge_outputs, write_tables
from p2p.telemetry._task import _run_task, _TaskConfig

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

TARGET_TASK_BYTES = 256 << 20
"""Landing bytes per decode task (at least two tasks per core)."""


@dataclass(frozen=True, slots=True)
class Options:
    """What ``p2p telemetry aggregate`` was asked to do."""

    landing: str
    out: str
    master: str = "local[*]"
    since: float | None = None
    until: float | None = None
    window: float = 3600.0
    partitions: int | None = None
    driver_memory: str = "2g"
    report: bool = True
    progress: bool = True
    ui: bool = False
    batch: bool = True
    """Validate in batches (:mod:`p2p.telemetry._batch`); ``False``: one ``validate`` per item."""
    compiled: bool = True
    """Read node and topic records with the compiled parser (:mod:`p2p.telemetry._fast`)
    where numba is installed; ``False``: every item takes the paths above."""


# ------------------------------------------------------------------ helpers


def parse_when(text: str | None) -> float | None:
    """``--since``/``--until``: an ISO date or datetime (naive means UTC) as Unix seconds."""
    return None if text is None else parse_time(text)


def _iso(t: float | None) -> str | None:
    return None if t is None else dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


# ------------------------------------------------------------------ spark


class _Progress:
    """Prints task progress of the running Spark stages every few seconds (a daemon thread)."""

    def __init__(
        self, sc: SparkContext, label: str, counter: Any, say: Callable[[str], None]
    ) -> None:
        self.sc, self.label, self.counter, self.say = sc, label, counter, say
        self.started = time.perf_counter()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="telemetry-progress", daemon=True)

    def __enter__(self) -> _Progress:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        last = ""
        while not self.stop_event.wait(3.0):
            try:
                tracker = self.sc.statusTracker()
                done = total = 0
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
                records = self.counter.value
            except Exception:  # the context is shutting down
                return
            if not total:
                continue
            elapsed = time.perf_counter() - self.started
            line = (
                f"      {self.label}: {done}/{total} tasks, {records / 1e6:.2f} M items, "
                f"{elapsed:.0f} s, {records / max(elapsed, 1e-9):,.0f} items/s"
            )
            if line != last:
                self.say(line)
                last = line


# --------------------------------------------------------------------- run


def run(
    opts: Options,
    spark: SparkSession | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the job; returns the summary (also written to ``OUT_DIR/summary.json``).

    ``spark``: an existing session to use (tests); otherwise one is started
    on ``opts.master`` and stopped at the end.  Paths are made absolute
    first (executors do not share the driver's working directory).  A run
    that reads no item, or keeps none, writes its tables and summary and
    then raises :class:`TelemetryError` with the first reasons.
    """

    def quiet(_: str) -> None:
        pass

    emit = say or (_stderr if opts.progress else quiet)
    opts = replace(opts, landing=absolute(opts.landing), out=absolute(opts.out))
    _check_options(opts)
    if spark is None:
        require_pyspark()  # the clear error before any work
    started = time.perf_counter()
    timings: dict[str, float] = {}
    own = spark is None
    if spark is None:
        emit(f"[0/5] starting Spark ({opts.master})...")
        spark = spark_session(opts.master, driver_memory=opts.driver_memory, ui=opts.ui)
        timings["start_spark"] = round(time.perf_counter() - started, 3)
    try:
        summary = _run(spark, opts, emit, started, timings)
    finally:
        if own:
            spark.stop()
    _fail_if_nothing_kept(summary)
    return summary


def _check_options(opts: Options) -> None:
    if not opts.window > 0:
        raise TelemetryError("--window must be positive")
    if opts.since is not None and opts.until is not None and opts.since >= opts.until:
        raise TelemetryError("--since must be before --until")
    if is_uri(opts.landing) and not opts.landing.startswith("file://"):
        return
    landing_path = Path(local_path(opts.landing))
    if not landing_path.is_dir():
        raise TelemetryError(f"landing directory {opts.landing} does not exist")
    if scheme(opts.out) in (None, "file"):
        out_res = Path(local_path(opts.out)).resolve()
        land_res = landing_path.resolve()
        if out_res == land_res or land_res in out_res.parents or out_res in land_res.parents:
            raise TelemetryError("OUT_DIR and LANDING_DIR must not contain each other")


def _fail_if_nothing_kept(summary: dict[str, Any]) -> None:
    """A run that read nothing, or quarantined everything, must not look like a success."""
    items, valid = summary["records_read"], summary["valid"]
    if items and valid:
        return
    first = "; ".join(summary["first_failures"]) or "no items in the files"
    what = "no record was read" if not items else f"all {items:,} items were quarantined"
    raise TelemetryError(f"{what} from {summary['files']:,} files under {summary['landing']}: "
                         f"{first}")  # fmt: skip


def _decode(
    spark: SparkSession, opts: Options, files: list[LandingFile], tasks: int, counter: Any
) -> list[tuple[Any, ...]]:
    """Runs the decode tasks (one Spark job) and returns their tagged outputs."""
    sc = spark.sparkContext
    cfg = _TaskConfig(opts.since, opts.until, opts.window, opts.batch, opts.compiled)
    body = partial(_run_task, cfg, counter)
    if is_uri(opts.landing):
        wanted = sc.broadcast({f.path: f for f in files})
        pairs = (
            sc.binaryFiles(opts.landing.rstrip("/") + "/date=*/device=*/*")
            .filter(lambda kv: kv[0] in wanted.value)
            .map(lambda kv: (wanted.value[kv[0]].device, (wanted.value[kv[0]], kv[1])))
            .groupByKey(tasks)
        )
        tagged = pairs.mapPartitions(body)
    else:
        bins = spread(files, tasks)
        tagged = sc.parallelize(bins, len(bins)).mapPartitions(
            lambda it: body(g for b in it for g in b)
        )
    sc.setJobDescription("decode and validate landing files")
    return tagged.collect()


def _run(
    spark: SparkSession,
    opts: Options,
    emit: Callable[[str], None],
    started: float,
    timings: dict[str, float],
) -> dict[str, Any]:
    sc = spark.sparkContext
    master = sc.master or opts.master

    t = time.perf_counter()
    emit(f"[1/5] listing files in {opts.landing}...")
    if is_uri(opts.landing):
        files, skipped, pruned = _list_uri(spark, opts.landing, opts.since)
    else:
        files, skipped, pruned = list_landing(opts.landing, opts.since)
    if not files:
        raise TelemetryError(
            f"no landing files under {opts.landing} (expected "
            "date=YYYY-MM-DD/device=<16 hex>/<boot>-<first seq>.cbor)"
        )
    total_bytes = sum(f.size for f in files)
    devices = len({f.device for f in files})
    tasks = max(1, min(opts.partitions or _tasks(total_bytes, sc.defaultParallelism), devices))
    timings["list"] = round(time.perf_counter() - t, 3)
    emit(
        f"      {len(files)} files, {total_bytes / 1e6:,.1f} MB, {devices} devices, "
        f"{len(skipped)} skipped, {pruned} pruned by --since ({timings['list']:.1f} s)"
    )

    t = time.perf_counter()
    emit(f"[2/5] decoding and validating on {tasks} tasks...")
    counter = sc.accumulator(0)
    watch = _Progress(sc, "decode", counter, emit) if opts.progress else contextlib.nullcontext()
    with watch:
        parts = _decode(spark, opts, files, tasks, counter)
    merging = time.perf_counter()
    merged = merge_outputs(parts)
    timings["decode_merge"] = round(time.perf_counter() - merging, 3)
    stats = merged.stats
    timings["decode"] = round(time.perf_counter() - t, 3)
    emit(
        f"      {stats['items']:,} items: {stats['valid']:,} valid, "
        f"{stats['items'] - stats['valid']:,} quarantined, {stats['duplicates']:,} duplicates, "
        f"{stats['outside_range']:,} outside --since/--until ({timings['decode']:.1f} s, "
        f"{stats['items'] / max(timings['decode'], 1e-9):,.0f} items/s)"
    )

    t = time.perf_counter()
    emit("[3/5] aggregating and writing tables...")
    tables = merged.tables(opts.window)
    schemas = _schemas()
    writer = write_tables(spark, opts.out, tables, schemas)
    rows = {name: len(tables[name]) for name in TABLES}
    timings["aggregate_write"] = round(time.perf_counter() - t, 3)
    emit(
        "      "
        + ", ".join(f"{name} {n:,} rows" for name, n in rows.items())
        + f" ({timings['aggregate_write']:.1f} s)"
    )

    summary = _summary(opts, stats, files, skipped, pruned, total_bytes, tasks, merged.span, rows)
    summary["first_failures"] = first_failures(tables["quarantine"])
    summary["spark"] = {"master": master, "version": spark.version, "tasks": tasks}
    summary["tables_written_by"] = writer
    summary["timings_s"] = timings
    if opts.report:
        t = time.perf_counter()
        emit("[4/5] writing report.html...")
        timings["report"] = 0.0
        write_report(opts.out, summary, named_rows(tables, schemas))
        timings["report"] = round(time.perf_counter() - t, 3)
    else:
        emit("[4/5] report skipped (--no-report)")
    timings["total"] = round(time.perf_counter() - started, 3)
    summary["records_per_s"] = round(stats["items"] / max(timings["total"], 1e-9), 1)
    write_text(opts.out, "summary.json", json.dumps(summary, indent=2) + "\n")
    emit(
        f"[5/5] done in {timings['total']:.1f} s: {stats['items']:,} items, "
        f"{summary['records_per_s']:,.0f} items/s; tables, summary.json"
        f"{' and report.html' if opts.report else ''} in {opts.out}"
    )
    return summary


def _tasks(total_bytes: int, cores: int) -> int:
    """Decode tasks: about ``TARGET_TASK_BYTES`` each, at least two per core, and a multiple
    of the cores, so that the last wave of tasks keeps every core busy."""
    waves = max(2, math.ceil(total_bytes / TARGET_TASK_BYTES / cores))
    return waves * cores


def first_failures(quarantine: list[tuple[Any, ...]], count: int = 3) -> list[str]:
    """``file@offset reason: error`` of the first quarantined items (in table order)."""
    out = []
    for file, offset, reason, _fld, error, *_ in quarantine[:count]:
        where = file if offset is None else f"{file}@{offset}"
        out.append(f"{where} {reason}: {error}"[:300])
    return out


def named_rows(
    tables: dict[str, list[tuple[Any, ...]]], schemas: dict[str, StructType]
) -> dict[str, list[dict[str, Any]]]:
    """The tables' rows as dicts keyed by column name (what the report reads)."""
    return {
        name: [dict(zip(schemas[name].names, row, strict=True)) for row in rows]
        for name, rows in tables.items()
    }


def _summary(
    opts: Options,
    stats: Counter[str],
    files: list[LandingFile],
    skipped: list[str],
    pruned: int,
    total_bytes: int,
    tasks: int,
    span: tuple[float, float],
    rows: dict[str, int],
) -> dict[str, Any]:
    items, valid = stats["items"], stats["valid"]
    return {
        "landing": opts.landing,
        "out": opts.out,
        "since": _iso(opts.since),
        "until": _iso(opts.until),
        "window_s": opts.window,
        "files": len(files),
        "files_read": stats["files"],
        "files_unreadable": stats["files_unreadable"],
        "files_skipped": len(skipped),
        "skipped": skipped[:50],
        "files_pruned": pruned,
        "bytes": total_bytes,
        "devices": len({f.device for f in files}),
        "records_read": items,
        "valid": valid,
        "quarantined": items - valid,
        "by_reason": {r: stats[f"reason_{r}"] for r in REASONS if stats[f"reason_{r}"]},
        "invalid_by_field": {
            k.removeprefix("field_"): v for k, v in sorted(stats.items()) if k.startswith("field_")
        },
        "duplicates_dropped": stats["duplicates"],
        "duplicates_conflicting": stats["duplicates_conflicting"],
        "outside_range": stats["outside_range"],
        "aggregated": stats["aggregated"],
        "compiled_path": stats["compiled"],
        "decode_tasks_wall_s": round(stats["task_wall_s"], 3),
        "decode_tasks_cpu_s": round(stats["task_cpu_s"], 3),
        "by_kind": {k: stats[f"kind_{k}"] for k in ("node", "topic", "event")},
        "span": {
            "start": _iso(span[0]) if span[1] else None,
            "end": _iso(span[1]) if span[1] else None,
        },
        "rows": rows,
        "options": {k: v for k, v in asdict(opts).items() if k not in ("landing", "out")},
    }


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


__all__ = [
    "LAYOUT",
    "REASONS",
    "SPARK_MISSING",
    "TABLES",
    "LandingFile",
    "Options",
    "classify",
    "list_landing",
    "parse_when",
    "run",
    "scan",
    "spark_session",
    "spread",
    "window_start",
]

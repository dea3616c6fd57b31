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
2. **Decode** on the executors.  All files of a device go to the same task
   (devices are spread over tasks by bytes), so duplicates (same ``id``,
   i.e. same device, boot and seq) are dropped there: the first in
   (date, file name, offset) order is kept.  Every item is validated with
   :func:`~p2p.telemetry.validate`; a record whose ``device`` is not its
   folder's is *misplaced*.  Bad items go to the quarantine, never crash
   the job.  Each task combines its records into partial aggregates
   (per device, per (window, topic), per window, per topic) and hands only
   those, the events and the quarantine rows to Spark.  For a URI the files
   are read with ``binaryFiles`` and grouped by device with a shuffle.
3. **Aggregate**: partials are merged with ``reduceByKey`` (counters add,
   histograms add element-wise), then percentiles come from the merged
   histograms (:func:`~p2p.telemetry.percentile`) and topics are ranked.
4. **Write** the tables (Parquet, one folder each under ``OUT_DIR``):

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

   plus ``summary.json`` (counts, by reason, timings) and ``report.html``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import math
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cbor2

from p2p.telemetry._batch import Checker, check_file
from p2p.telemetry._generate import parse_time
from p2p.telemetry._report import write_report
from p2p.telemetry._schema import (
    BUCKETS,
    EVENTS,
    HISTOGRAMS,
    MAX_RECORD_BYTES,
    NODE_COUNTERS,
    TelemetryError,
    percentile,
)
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

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

LAYOUT = re.compile(r"date=(\d{4}-\d{2}-\d{2}|unknown)/device=([0-9a-f]{16})/(\d+)-(\d+)\.cbor")
"""A landing file's path below LANDING_DIR."""
REASONS = ("undecodable", "oversize", "schema_version", "invalid", "misplaced", "unreadable")
"""Why an item is quarantined."""
TABLES = ("devices", "topics", "windows", "fleet", "timeline", "quarantine")
HEX_PREFIX = 64
"""Bytes of a quarantined item kept (as hex)."""
TARGET_TASK_BYTES = 64 << 20
"""Landing bytes per decode task (at least two tasks per core)."""
_FLUSH = 64
"""Histograms buffered per key before they are summed."""
NH = len(HISTOGRAMS)
_LATENCY, _HOLDBACK, _ACK_ROUND = HISTOGRAMS  # the order of every histogram list here
QS = (0.5, 0.95, 0.99)


@dataclass(frozen=True, slots=True)
class LandingFile:
    path: str
    size: int
    date: str
    device: str
    boot: int
    seq: int


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


# ------------------------------------------------------------------ helpers


def parse_when(text: str | None) -> float | None:
    """``--since``/``--until``: an ISO date or datetime (naive means UTC) as Unix seconds."""
    return None if text is None else parse_time(text)


def _ts(t: float | None) -> dt.datetime | None:
    return None if t is None else dt.datetime.fromtimestamp(t, dt.UTC)


def _iso(t: float | None) -> str | None:
    return None if t is None else dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


def window_start(t: float, length: float, width: float) -> float:
    """Start of the ``width``-second window holding a record (by its window's midpoint)."""
    return math.floor((t - length / 2) / width) * width


def scan(data: bytes) -> Iterator[tuple[int, int, object, str | None]]:
    """:func:`~p2p.telemetry.iter_items` with byte offsets: ``(start, end, item, error)``.

    Same rules (a corrupt item ends the file, an item over ``MAX_RECORD_BYTES``
    is an error and scanning goes on), and any decoder exception is a corrupt
    item rather than a crash.
    """
    stream = io.BytesIO(data)
    decoder = cbor2.CBORDecoder(stream)
    size = len(data)
    while stream.tell() < size:
        start = stream.tell()
        try:
            item = decoder.decode()
        except Exception as exc:  # iter_items: CBORDecodeError, ValueError, EOFError, ...
            yield start, size, None, f"undecodable CBOR at byte {start}: {exc}"[:300]
            return
        end = stream.tell()
        if end - start > MAX_RECORD_BYTES:
            yield start, end, None, f"record at byte {start} exceeds {MAX_RECORD_BYTES} bytes"
            continue
        yield start, end, item, None


def classify(error: str, decoded: bool) -> tuple[str, str]:
    """``(reason, field)`` of a bad item from its error message."""
    if not decoded:
        return ("oversize" if "exceeds" in error else "undecodable"), ""
    if error.startswith("v:"):
        return "schema_version", "v"
    if error.startswith("unknown keys"):
        return "invalid", "unknown_keys"
    return "invalid", error.split(":", 1)[0][:40]


# ---------------------------------------------------------------- listing


def list_landing(
    landing: str, since: float | None = None
) -> tuple[list[LandingFile], list[str], int]:
    """Landing files under a local ``landing`` dir: ``(files, skipped, pruned)``."""
    root = Path(local_path(landing))
    if not root.is_dir():
        raise TelemetryError(f"landing directory {landing} does not exist")
    files: list[LandingFile] = []
    skipped: list[str] = []
    pruned = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("_", ".")))
        for name in sorted(filenames):
            if name.startswith(("_", ".")) or name.endswith(".tmp"):
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            lf = _landing_file(full, rel, os.path.getsize(full))
            pruned += _triage(lf, rel, since, files, skipped)
    return files, skipped, pruned


def _landing_file(full: str, rel: str, size: int) -> LandingFile | None:
    m = LAYOUT.fullmatch(rel)
    if m is None:
        return None
    return LandingFile(full, size, m.group(1), m.group(2), int(m.group(3)), int(m.group(4)))


def _triage(
    lf: LandingFile | None,
    rel: str,
    since: float | None,
    files: list[LandingFile],
    skipped: list[str],
) -> int:
    """File a listed path: not a landing file (``skipped``), before ``--since`` (returns 1,
    pruned), or one to read (``files``)."""
    if lf is None:
        skipped.append(rel)
        return 0
    if _pruned(lf.date, since):
        return 1
    files.append(lf)
    return 0


def _pruned(date: str, since: float | None) -> bool:
    if since is None or date == "unknown":
        return False
    day = dt.datetime.fromisoformat(date).replace(tzinfo=dt.UTC).timestamp()
    return day + 2 * 86400 <= since


def _list_uri(
    spark: SparkSession, landing: str, since: float | None
) -> tuple[list[LandingFile], list[str], int]:
    """The same listing through the Hadoop FileSystem (any URI Spark can read)."""
    jvm: Any = spark.sparkContext._jvm
    jsc: Any = spark.sparkContext._jsc
    base = landing.rstrip("/")
    path = jvm.org.apache.hadoop.fs.Path(base)
    fs = path.getFileSystem(jsc.hadoopConfiguration())
    if not fs.exists(path):
        raise TelemetryError(f"landing directory {landing} does not exist")
    root = fs.makeQualified(path).toString().rstrip("/")
    statuses = fs.globStatus(jvm.org.apache.hadoop.fs.Path(base + "/date=*/device=*/*")) or []
    files: list[LandingFile] = []
    skipped: list[str] = []
    pruned = 0
    for st in statuses:
        full = st.getPath().toString()
        rel = full[len(root) + 1 :] if full.startswith(root + "/") else full
        name = rel.rsplit("/", 1)[-1]
        if st.isDirectory() or name.startswith(("_", ".")) or name.endswith(".tmp"):
            continue
        lf = _landing_file(full, rel, int(st.getLen()))
        pruned += _triage(lf, rel, since, files, skipped)
    return sorted(files, key=lambda f: f.path), sorted(skipped), pruned


def spread(files: list[LandingFile], tasks: int) -> list[list[tuple[str, list[LandingFile]]]]:
    """Devices (with all their files) spread over ``tasks`` bins by bytes, largest first."""
    by_device: dict[str, list[LandingFile]] = {}
    for f in files:
        by_device.setdefault(f.device, []).append(f)
    bins: list[list[tuple[str, list[LandingFile]]]] = [[] for _ in range(tasks)]
    load = [0] * tasks
    weight = {d: sum(f.size for f in fs) + 1 for d, fs in by_device.items()}
    for device in sorted(by_device, key=lambda d: (-weight[d], d)):
        i = min(range(tasks), key=lambda k: (load[k], k))
        bins[i].append((device, by_device[device]))
        load[i] += weight[device]
    return [b for b in bins if b]


# ------------------------------------------------------ per-task aggregation


def _hist_sum(acc: list[int], pending: list[list[int]]) -> list[int]:
    return [sum(col) for col in zip(acc, *pending, strict=True)]


class _Window:
    """Partial aggregate of one (window, topic) in one task."""

    __slots__ = (
        "deliveries",
        "devices",
        "held",
        "hists",
        "last",
        "number",
        "pending",
        "pubs",
        "records",
    )

    def __init__(self, number: int) -> None:
        self.number = number
        """Its row in the task's numpy histogram sums (:class:`_HistSums`)."""
        self.records = self.devices = self.pubs = self.deliveries = self.held = 0
        self.last: object = None
        """The device (its accumulator) that last added here: counts distinct devices."""
        self.hists = [[0] * (BUCKETS + 1) for _ in range(NH)]
        self.pending: list[list[list[int]]] = [[] for _ in range(NH)]

    def flush(self) -> None:
        for i in range(NH):
            if self.pending[i]:
                self.hists[i] = _hist_sum(self.hists[i], self.pending[i])
                self.pending[i] = []

    def partial(self, sums: _HistSums) -> list[Any]:
        self.flush()
        hists = sums.add_to(self.number, self.hists)
        return [self.records, self.devices, self.pubs, self.deliveries, self.held, *hists]


class _HistSums:
    """Histogram sums of the records accepted in batch, one int64 row per (window, topic)."""

    def __init__(self) -> None:
        self.sums: Any = None
        self.keys: list[int] = []
        self.batches: list[tuple[Any, list[int]]] = []

    def add(self, number: int, hists: Any, row: int) -> None:
        """Schedules ``hists[row]`` to be added to row ``number`` (see :meth:`fold`)."""
        if not self.batches or self.batches[-1][0] is not hists:
            self.batches.append((hists, []))
        self.keys.append(number)
        self.batches[-1][1].append(row)

    def fold(self, size: int) -> None:
        """Adds the scheduled rows (``size``: the number of windows so far)."""
        if not self.keys:
            return
        import numpy as np

        if self.sums is None or len(self.sums) < size:
            grown = np.zeros((max(size, 2 * (0 if self.sums is None else len(self.sums))), NH,
                              BUCKETS + 1), dtype=np.int64)  # fmt: skip
            if self.sums is not None:
                grown[: len(self.sums)] = self.sums
            self.sums = grown
        rows = np.concatenate([hists[r] for hists, r in self.batches])
        np.add.at(self.sums, np.array(self.keys), rows)
        self.keys, self.batches = [], []

    def add_to(self, number: int, hists: list[list[int]]) -> list[list[int]]:
        if self.sums is None or number >= len(self.sums):
            return hists
        extra = self.sums[number].tolist()
        return [
            [a + b for a, b in zip(h, e, strict=True)] for h, e in zip(hists, extra, strict=True)
        ]


# fleet partial layout (per window): name -> (index, merge op)
FLEET_FIELDS = (
    ("devices", "sum"),
    ("records", "sum"),
    ("node_records", "sum"),
    ("topic_records", "sum"),
    ("events", "sum"),
    ("publications", "sum"),
    ("deliveries", "sum"),
    ("held", "sum"),
    ("rss_sum", "sum"),
    ("rss_max", "max"),
    ("cpu_s", "sum"),
    ("node_window_s", "sum"),
    ("packets_sent", "sum"),
    ("packets_received", "sum"),
    ("bytes_sent", "sum"),
    ("bytes_received", "sum"),
    ("suspicions", "sum"),
    ("repairs", "sum"),
    ("rejected", "sum"),
    ("dropped", "sum"),
    *((f"event_{e}", "sum") for e in EVENTS),
    ("latency", "hist"),
)
_F = {name: i for i, (name, _) in enumerate(FLEET_FIELDS)}
_FLEET_NODE = (
    "packets_sent",
    "packets_received",
    "bytes_sent",
    "bytes_received",
    "suspicions",
    "repairs",
    "rejected",
    "dropped",
)


_RECORDS = _F["records"]
_FLEET_NODE_INDEX = tuple((name, _F[name]) for name in _FLEET_NODE)


def _new_fleet() -> list[Any]:
    return [[0] * (BUCKETS + 1) if op == "hist" else 0 for _, op in FLEET_FIELDS]


@dataclass(slots=True)
class _Device:
    device: str
    records: int = 0
    node_records: int = 0
    topic_records: int = 0
    events: int = 0
    boots: set[int] = field(default_factory=set)
    first: float = math.inf
    last: float = -math.inf
    rss_sum: int = 0
    rss_max: int = 0
    cpu_s: float = 0.0
    window_s: float = 0.0
    connections: int = 0
    counters: Counter[str] = field(default_factory=Counter)
    publications: int = 0
    deliveries: int = 0
    held: int = 0
    crashes: int = 0
    starts: int = 0
    duplicates: int = 0
    quarantined: int = 0


DEVICE_COUNTERS = tuple(c for c in NODE_COUNTERS if c not in ("rss_bytes", "connections"))
"""The node counters summed per device (RSS and connections are gauges: mean and max)."""


class _Run:
    """Per-device state while one device's records are folded in."""

    __slots__ = ("acc", "fleet", "fleet_keys", "topics", "ws")

    def __init__(self, acc: _Device) -> None:
        self.acc = acc
        self.ws: float | None = None
        self.fleet: list[Any] = []
        self.fleet_keys: set[float] = set()
        self.topics: dict[str, list[float]] = {}


@dataclass(frozen=True, slots=True)
class _TaskConfig:
    since: float | None
    until: float | None
    width: float
    batch: bool = True


class _Task:
    """Everything one decode task produces from its devices."""

    def __init__(self, cfg: _TaskConfig) -> None:
        self.cfg = cfg
        self.stats: Counter[str] = Counter()
        self.t_first = math.inf
        self.t_last = -math.inf
        self.windows: dict[tuple[float, str], _Window] = {}
        self.fleet: dict[float, list[Any]] = {}
        self.topic_devices: Counter[str] = Counter()
        self.topic_span: dict[str, list[float]] = {}
        self.devices: list[tuple[Any, ...]] = []
        self.events: list[tuple[Any, ...]] = []
        self.quarantine: list[tuple[Any, ...]] = []
        self._run = _Run(_Device(""))
        self.checker = Checker()
        self.sums = _HistSums()

    def _fleet(self, ws: float) -> list[Any]:
        part = self.fleet.get(ws)
        if part is None:
            part = self.fleet[ws] = _new_fleet()
        return part

    def _bad(
        self, lf: LandingFile, offset: int | None, reason: str, fld: str, error: str, raw: bytes
    ) -> None:
        self.stats[f"reason_{reason}"] += 1
        if reason == "invalid":
            self.stats[f"field_{fld}"] += 1
        self.quarantine.append(
            (lf.path, offset, reason, fld, error[:300], raw[:HEX_PREFIX].hex(), lf.device, lf.date)
        )

    def device(self, device: str, files: Iterable[tuple[LandingFile, bytes | None]]) -> int:
        """Decode, validate, dedupe and aggregate one device's files; returns items read."""
        cfg, stats = self.cfg, self.stats
        since, until = cfg.since, cfg.until
        acc = _Device(device)
        seen: dict[tuple[int, int], int] = {}
        items = valid = duplicates = conflicting = outside = 0
        self._run = _Run(acc)
        ordered = sorted(files, key=lambda p: (p[0].date, p[0].boot, p[0].seq, p[0].path))
        for lf, blob in ordered:
            stats["files"] += 1
            if blob is None:
                try:
                    with open(local_path(lf.path), "rb") as fh:
                        blob = fh.read()
                except OSError as exc:
                    stats["files_unreadable"] += 1
                    items += 1
                    acc.quarantined += 1
                    self._bad(lf, None, "unreadable", "", f"{type(exc).__name__}: {exc}", b"")
                    continue
            stats["bytes"] += len(blob)
            scanned = list(scan(blob))
            verdicts, hists, rows = check_file(self.checker, blob, scanned, cfg.batch)
            for i, (start, end, _, error) in enumerate(scanned):
                items += 1
                if error is not None:
                    reason, fld = classify(error, False)
                    acc.quarantined += 1
                    self._bad(lf, start, reason, fld, error, blob[start:end])
                    continue
                rec = verdicts[i]
                if isinstance(rec, Exception):  # TelemetryError, or anything odd in the item
                    reason, fld = classify(str(rec), True)
                    acc.quarantined += 1
                    self._bad(lf, start, reason, fld, str(rec), blob[start:end])
                    continue
                if rec["device"] != device:
                    acc.quarantined += 1
                    self._bad(
                        lf,
                        start,
                        "misplaced",
                        "device",
                        f"record of device {rec['device']} under device={device}",
                        blob[start:end],
                    )
                    continue
                valid += 1
                key = (rec["boot"], rec["seq"])
                digest = hash(blob[start:end])
                previous = seen.get(key)
                if previous is not None:
                    duplicates += 1
                    conflicting += previous != digest
                    continue
                seen[key] = digest
                t = rec["t"]
                if (since is not None and t < since) or (until is not None and t >= until):
                    outside += 1
                    continue
                self._add(rec, t, hists, rows.get(i, -1))
            self.sums.fold(len(self.windows))
        run = self._run
        for ws in run.fleet_keys:
            self.fleet[ws][_F["devices"]] += 1
        for topic, (first, last) in run.topics.items():
            self.topic_devices[topic] += 1
            span = self.topic_span.get(topic)
            if span is None:
                self.topic_span[topic] = [first, last]
            else:
                span[0] = min(span[0], first)
                span[1] = max(span[1], last)
        acc.duplicates = duplicates
        stats["items"] += items
        stats["valid"] += valid
        stats["duplicates"] += duplicates
        stats["duplicates_conflicting"] += conflicting
        stats["outside_range"] += outside
        stats["aggregated"] += acc.records
        stats["kind_node"] += acc.node_records
        stats["kind_topic"] += acc.topic_records
        stats["kind_event"] += acc.events
        if acc.records or acc.quarantined:
            self.devices.append(_device_row(acc))
        return items

    def _add(self, rec: dict[str, Any], t: float, hists: Any = None, row: int = -1) -> None:
        """Fold one kept record into the device, its window and its (window, topic);
        its histograms are ``hists[row]`` if it was accepted in batch (``row >= 0``)."""
        run = self._run
        acc = run.acc
        length, kind = rec["window"], rec["kind"]
        acc.records += 1
        acc.boots.add(rec["boot"])
        begin = t - length
        if begin < acc.first:
            acc.first = begin
        if t > acc.last:
            acc.last = t
        ws = math.floor((t - length / 2) / self.cfg.width) * self.cfg.width
        if ws == run.ws:
            fleet = run.fleet
        else:
            fleet = run.fleet = self._fleet(ws)
            run.ws = ws
            run.fleet_keys.add(ws)
        fleet[_RECORDS] += 1
        if kind == "topic":
            if begin < self.t_first:
                self.t_first = begin
            if t > self.t_last:
                self.t_last = t
            acc.topic_records += 1
            pubs, deliveries, held = rec["publications"], rec["deliveries"], rec["held"]
            acc.publications += pubs
            acc.deliveries += deliveries
            acc.held += held
            topic = rec["topic"]
            key = (ws, topic)
            part = self.windows.get(key)
            if part is None:
                part = self.windows[key] = _Window(len(self.windows))
            if part.last is not acc:
                part.last = acc
                part.devices += 1
            part.records += 1
            part.pubs += pubs
            part.deliveries += deliveries
            part.held += held
            if row >= 0:
                self.sums.add(part.number, hists, row)
            else:
                pending = part.pending
                pending[0].append(rec[_LATENCY])
                pending[1].append(rec[_HOLDBACK])
                pending[2].append(rec[_ACK_ROUND])
                if len(pending[0]) >= _FLUSH:
                    part.flush()
            span = run.topics.get(topic)
            if span is None:
                run.topics[topic] = [begin, t]
            else:
                if begin < span[0]:
                    span[0] = begin
                if t > span[1]:
                    span[1] = t
        elif kind == "node":
            if begin < self.t_first:
                self.t_first = begin
            if t > self.t_last:
                self.t_last = t
            acc.node_records += 1
            rss = rec["rss_bytes"]
            cpu = rec["cpu_s"]
            acc.rss_sum += rss
            if rss > acc.rss_max:
                acc.rss_max = rss
            acc.cpu_s += cpu
            acc.window_s += length
            acc.connections += rec["connections"]
            counters = acc.counters
            for name in DEVICE_COUNTERS:
                counters[name] += rec[name]
            fleet[_F["node_records"]] += 1
            fleet[_F["rss_sum"]] += rss
            if rss > fleet[_F["rss_max"]]:
                fleet[_F["rss_max"]] = rss
            fleet[_F["cpu_s"]] += cpu
            fleet[_F["node_window_s"]] += length
            for name, index in _FLEET_NODE_INDEX:
                fleet[index] += rec[name]
        else:
            event = rec["event"]
            acc.events += 1
            acc.crashes += event == "crash"
            acc.starts += event == "start"
            fleet[_F["events"]] += 1
            fleet[_F[f"event_{event}"]] += 1
            self.events.append(
                (
                    _ts(t),
                    float(t),
                    rec["device"],
                    rec["boot"],
                    rec["seq"],
                    event,
                    rec.get("peer"),
                    rec.get("detail"),
                    rec["id"],
                )
            )

    def output(self) -> Iterator[tuple[Any, ...]]:
        """Tagged rows: ``s`` stats, ``d`` device, ``w`` (window, topic) partial, ``t`` topic
        partial, ``f`` window partial, ``e`` event, ``q`` quarantine."""
        stats: dict[str, Any] = dict(self.stats)
        stats["t_first"] = self.t_first
        stats["t_last"] = self.t_last
        yield ("s", stats)
        for row in self.devices:
            yield ("d", row)
        topics: dict[str, list[Any]] = {}
        for (ws, topic), part in self.windows.items():
            values = part.partial(self.sums)
            yield ("w", (ws, topic), values)
            fleet = self._fleet(ws)
            fleet[_F["topic_records"]] += part.records
            fleet[_F["publications"]] += part.pubs
            fleet[_F["deliveries"]] += part.deliveries
            fleet[_F["held"]] += part.held
            latency = zip(fleet[_F["latency"]], values[5], strict=True)
            fleet[_F["latency"]] = [a + b for a, b in latency]
            tp = topics.get(topic)
            if tp is None:
                topics[topic] = [values[0], self.topic_devices[topic], *values[2:]]
            else:
                topics[topic] = _merge_counts(tp, [values[0], 0, *values[2:]])
        for topic, tp in topics.items():
            yield ("t", topic, [*tp, *self.topic_span[topic]])
        for ws, fleet in self.fleet.items():
            yield ("f", ws, fleet)
        for row in self.events:
            yield ("e", row)
        for row in self.quarantine:
            yield ("q", row)


def _device_row(a: _Device) -> tuple[Any, ...]:
    n = a.node_records
    c = a.counters
    return (
        a.device,
        a.records,
        a.node_records,
        a.topic_records,
        a.events,
        len(a.boots),
        _ts(a.first) if a.records else None,
        _ts(a.last) if a.records else None,
        a.rss_sum / n if n else None,
        a.rss_max if n else None,
        a.cpu_s,
        100 * a.cpu_s / a.window_s if a.window_s else None,
        a.connections / n if n else None,
        *(c[name] for name in DEVICE_COUNTERS),
        a.publications,
        a.deliveries,
        a.held,
        a.crashes,
        a.starts,
        a.duplicates,
        a.quarantined,
    )


def _merge_counts(a: list[Any], b: list[Any]) -> list[Any]:
    """Element-wise sum of ints and histograms (lists)."""
    return [
        [p + q for p, q in zip(x, y, strict=True)] if isinstance(x, list) else x + y
        for x, y in zip(a, b, strict=True)
    ]


def _merge_topic(a: list[Any], b: list[Any]) -> list[Any]:
    return [*_merge_counts(a[:-2], b[:-2]), min(a[-2], b[-2]), max(a[-1], b[-1])]


def _merge_fleet(a: list[Any], b: list[Any]) -> list[Any]:
    out = []
    for (_, op), x, y in zip(FLEET_FIELDS, a, b, strict=True):
        if op == "hist":
            out.append([p + q for p, q in zip(x, y, strict=True)])
        elif op == "max":
            out.append(max(x, y))
        else:
            out.append(x + y)
    return out


def _run_task(cfg: _TaskConfig, counter: Any, groups: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """mapPartitions body: ``groups`` of ``(device, files)``, ``files`` with or without bytes."""
    task = _Task(cfg)
    for device, files in groups:
        pairs = [(f, None) if isinstance(f, LandingFile) else f for f in files]
        counter.add(task.device(device, pairs))
    yield from task.output()


# ---------------------------------------------------------------- finalizing


def _pcts(hist: list[int]) -> list[float | None]:
    return [percentile(hist, q) for q in QS]


def _all_pcts(hists: list[list[int]]) -> list[float | None]:
    return [p for h in hists for p in _pcts(h)]


def _rate(count: int, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


def _covered(ws: float, width: float, span: tuple[float, float]) -> float:
    covered = min(ws + width, span[1]) - max(ws, span[0])
    return covered if covered > 0 else width


def _window_row(
    width: float, span: tuple[float, float], kv: tuple[tuple[float, str], list[Any]]
) -> tuple[Any, ...]:
    (ws, topic), v = kv
    return (
        _ts(ws),
        _ts(ws + width),
        topic,
        *_traffic(v, _covered(ws, width, span)),
        *v[5 : 5 + NH],
    )


def _topic_row(span: tuple[float, float], kv: tuple[str, list[Any]]) -> tuple[Any, ...]:
    topic, v = kv
    return (topic, *_traffic(v, span[1] - span[0]), _ts(v[-2]), _ts(v[-1]), *v[5 : 5 + NH])


def _traffic(v: list[Any], secs: float) -> tuple[Any, ...]:
    """The columns a topic row and a window row share: counts, rates over ``secs``, percentiles.

    ``v`` is a merged partial: records, devices, publications, deliveries,
    held, then the histograms.
    """
    records, devices, pubs, deliveries, held = v[:5]
    rates = (_rate(pubs, secs), _rate(deliveries, secs))
    return (records, devices, pubs, deliveries, held, *rates, *_all_pcts(v[5 : 5 + NH]))


def _fleet_row(
    width: float, span: tuple[float, float], kv: tuple[float, list[Any]]
) -> tuple[Any, ...]:
    ws, v = kv
    f = dict(zip((name for name, _ in FLEET_FIELDS), v, strict=True))
    secs = _covered(ws, width, span)
    nodes = f["node_records"]
    return (
        _ts(ws),
        _ts(ws + width),
        f["devices"],
        f["records"],
        nodes,
        f["topic_records"],
        f["events"],
        f["publications"],
        f["deliveries"],
        f["held"],
        _rate(f["publications"], secs),
        _rate(f["deliveries"], secs),
        *_pcts(f["latency"]),
        f["rss_sum"] / nodes if nodes else None,
        f["rss_max"] if nodes else None,
        100 * f["cpu_s"] / f["node_window_s"] if f["node_window_s"] else None,
        *(f[name] for name in _FLEET_NODE),
        *(f[f"event_{e}"] for e in EVENTS),
        f["latency"],
    )


class Merged:
    """The decode tasks' outputs merged on the driver: everything the tables are made of.

    Partials are small (one per device, per (window, topic), per window, per
    topic and task), so merging them here costs less than a shuffle.
    """

    def __init__(self) -> None:
        self.stats: Counter[str] = Counter()
        self.t_first, self.t_last = math.inf, -math.inf
        self.devices: list[tuple[Any, ...]] = []
        # keyed by (window start, topic), topic, window start
        self.windows: dict[Any, list[Any]] = {}
        self.topics: dict[Any, list[Any]] = {}
        self.fleet: dict[Any, list[Any]] = {}
        self.events: list[tuple[Any, ...]] = []
        self.quarantine: list[tuple[Any, ...]] = []

    def add(self, row: tuple[Any, ...]) -> None:
        tag = row[0]
        if tag == "s":
            part = dict(row[1])
            self.t_first = min(self.t_first, part.pop("t_first"))
            self.t_last = max(self.t_last, part.pop("t_last"))
            self.stats.update(part)
        elif tag == "d":
            self.devices.append(row[1])
        elif tag == "e":
            self.events.append(row[1])
        elif tag == "q":
            self.quarantine.append(row[1])
        else:
            keyed = {"w": self.windows, "t": self.topics, "f": self.fleet}[tag]
            _fold(keyed, row[1], row[2], _MERGE[tag])

    @property
    def span(self) -> tuple[float, float]:
        """First window start and last window end of the kept node and topic records."""
        return (self.t_first, self.t_last) if self.t_first < self.t_last else (0.0, 0.0)

    def tables(self, width: float) -> dict[str, list[tuple[Any, ...]]]:
        """Every output table's rows, in the order they are written."""
        span = self.span
        topics = sorted(
            (_topic_row(span, kv) for kv in self.topics.items()),
            key=lambda row: (-row[3], -row[4], row[0]),
        )
        return {
            "devices": sorted(self.devices, key=lambda row: row[0]),
            "topics": [(row[0], rank, *row[1:]) for rank, row in enumerate(topics, 1)],
            "windows": [_window_row(width, span, kv) for kv in sorted(self.windows.items())],
            "fleet": [_fleet_row(width, span, kv) for kv in sorted(self.fleet.items())],
            "timeline": sorted(self.events, key=lambda row: (row[1], row[2], row[3], row[4])),
            "quarantine": sorted(
                self.quarantine, key=lambda row: (row[0], row[1] is not None, row[1] or 0)
            ),
        }


_MERGE: dict[str, Callable[[list[Any], list[Any]], list[Any]]] = {
    "w": _merge_counts,
    "t": _merge_topic,
    "f": _merge_fleet,
}


def _fold(
    into: dict[Any, list[Any]],
    key: Any,
    value: list[Any],
    merge: Callable[[list[Any], list[Any]], list[Any]],
) -> None:
    previous = into.get(key)
    into[key] = value if previous is None else merge(previous, value)


def merge_outputs(rows: Iterable[tuple[Any, ...]]) -> Merged:
    """All tagged task outputs merged (see :meth:`_Task.output` for the tags)."""
    merged = Merged()
    for row in rows:
        merged.add(row)
    return merged


# ------------------------------------------------------------------- schemas


def _schemas() -> dict[str, StructType]:
    from pyspark.sql.types import (
        ArrayType,
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    def cols(spec: str) -> list[StructField]:
        kinds = {
            "s": StringType(),
            "l": LongType(),
            "d": DoubleType(),
            "t": TimestampType(),
            "h": ArrayType(LongType(), containsNull=False),
        }
        out = []
        for item in spec.split():
            name, kind = item.rsplit(":", 1)
            out.append(StructField(name, kinds[kind], nullable=True))
        return out

    pct = " ".join(f"{h}_p{round(q * 100)}_ms:d" for h in HISTOGRAMS for q in QS)
    hists = " ".join(f"{h}_hist:h" for h in HISTOGRAMS)
    counters = " ".join(f"{c}:l" for c in DEVICE_COUNTERS)
    node = " ".join(f"{c}:l" for c in _FLEET_NODE)
    events = " ".join(f"event_{e}:l" for e in EVENTS)
    return {
        "devices": StructType(
            cols(
                "device:s records:l node_records:l topic_records:l events:l boots:l "
                "first_seen:t last_seen:t rss_mean_bytes:d rss_max_bytes:l cpu_s:d cpu_pct:d "
                f"connections_mean:d {counters} publications:l deliveries:l held:l "
                "crashes:l starts:l duplicates:l quarantined:l"
            )
        ),
        "topics": StructType(
            cols(
                "topic:s hot_rank:l records:l devices:l publications:l deliveries:l held:l "
                f"pub_rate_per_s:d delivery_rate_per_s:d {pct} first_seen:t last_seen:t {hists}"
            )
        ),
        "windows": StructType(
            cols(
                "window_start:t window_end:t topic:s records:l devices:l publications:l "
                f"deliveries:l held:l pub_rate_per_s:d delivery_rate_per_s:d {pct} {hists}"
            )
        ),
        "fleet": StructType(
            cols(
                "window_start:t window_end:t devices:l records:l node_records:l "
                "topic_records:l events:l publications:l deliveries:l held:l pub_rate_per_s:d "
                "delivery_rate_per_s:d latency_p50_ms:d latency_p95_ms:d latency_p99_ms:d "
                f"rss_mean_bytes:d rss_max_bytes:l cpu_pct:d {node} {events} latency_hist:h"
            )
        ),
        "timeline": StructType(
            cols("t:t t_unix:d device:s boot:l seq:l event:s peer:s detail:s id:s")
        ),
        "quarantine": StructType(
            cols("file:s offset:l reason:s field:s error:s raw_hex:s device:s date:s")
        ),
    }


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
    cfg = _TaskConfig(opts.since, opts.until, opts.window, opts.batch)
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
    tasks = opts.partitions or max(
        2 * sc.defaultParallelism, math.ceil(total_bytes / TARGET_TASK_BYTES)
    )
    tasks = max(1, min(tasks, devices))
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
    merged = merge_outputs(parts)
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
    for name in TABLES:
        sc.setJobDescription(f"write {name}")
        # Local rows are converted on the driver and unpickled by the JVM (no Python
        # worker); coalesce(1) keeps their order in one file without a shuffle.
        frame = spark.createDataFrame(tables[name], schemas[name], verifySchema=False)
        frame.coalesce(1).write.mode("overwrite").parquet(f"{opts.out.rstrip('/')}/{name}")
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

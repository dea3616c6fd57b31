"""One decode task: decode, validate, dedupe and fold a group of devices' records into
partial aggregates (per device, per (window, topic), per window, per topic), events and
quarantine rows.  Runs on the executors."""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from p2p.telemetry._batch import CHUNK, Checker, check_file
from p2p.telemetry._schema import (
    BUCKETS,
    EVENTS,
    HISTOGRAMS,
    NODE_COUNTERS,
)
from p2p.telemetry._spark import local_path

if TYPE_CHECKING:
    pass
from p2p.telemetry._listing import LandingFile, classify, scan

HEX_PREFIX = 64
"""Bytes of a quarantined item kept (as hex)."""
_FLUSH = 64
"""Histograms buffered per key before they are summed."""
NH = len(HISTOGRAMS)
_LATENCY, _HOLDBACK, _ACK_ROUND = HISTOGRAMS  # the order of every histogram list here


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """``items`` in lists of ``size`` (the last one shorter)."""
    while chunk := list(islice(items, size)):
        yield chunk


def _ts(t: float | None) -> dt.datetime | None:
    return None if t is None else dt.datetime.fromtimestamp(t, dt.UTC)


def window_start(t: float, length: float, width: float) -> float:
    """Start of the ``width``-second window holding a record (by its window's midpoint)."""
    return math.floor((t - length / 2) / width) * width


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
"""The node counters the fleet table sums (one source: the layout below uses it)."""

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
    *((name, "sum") for name in _FLEET_NODE),
    *((f"event_{e}", "sum") for e in EVENTS),
    ("latency", "hist"),
)
_F = {name: i for i, (name, _) in enumerate(FLEET_FIELDS)}


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
            # In chunks: a whole file of decoded records held at once costs twice the decode
            # (allocator and cache); a chunk is also one numpy batch.
            for scanned in _chunks(scan(blob), CHUNK):
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

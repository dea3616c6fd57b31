"""The accumulators of a decode task (:mod:`p2p.telemetry._task`) and the partials they
give: per (window, topic) (:class:`_Window`, histograms summed in batch by
:class:`_HistSums`), per window (the fleet partial, laid out by :data:`FLEET_FIELDS`),
per device (:class:`_Device`, one row by :func:`_device_row`), a device's dedupe
counts (:class:`_Counts`), and the rules the driver merges partials of several tasks
with (:mod:`p2p.telemetry._tables`).  Runs on the executors and on the driver."""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from p2p.telemetry._schema import (
    BUCKETS,
    EVENTS,
    HISTOGRAMS,
    NODE_COUNTERS,
)

_FLUSH = 64
"""Histograms buffered per key before they are summed."""
NH = len(HISTOGRAMS)
_LATENCY, _HOLDBACK, _ACK_ROUND = HISTOGRAMS  # the order of every histogram list here


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


_FLEET_NODE = tuple(
    c
    for c in NODE_COUNTERS
    if c not in ("rss_bytes", "connections", "frames_sent", "frames_received")
)
"""The node counters the fleet table sums, in schema order: all but the gauges and the
frame counts (one source: the layout below uses it)."""

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


class _Counts:
    """One device's item counts and dedupe keys while its files are read."""

    __slots__ = ("conflicting", "duplicates", "items", "outside", "seen", "valid")

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], int] = {}
        self.items = self.valid = self.duplicates = self.conflicting = self.outside = 0

    def first(self, boot: int, seq: int, digest: int) -> bool:
        """Whether (boot, seq) is new (then it is remembered with ``digest``, its bytes'
        hash); a duplicate is counted, and as conflicting if its bytes differ."""
        key = (boot, seq)
        previous = self.seen.get(key)
        if previous is None:
            self.seen[key] = digest
            return True
        self.duplicates += 1
        self.conflicting += previous != digest
        return False

    def firsts(self, boots: list[int], seqs: list[int], digests: list[int]) -> Any:
        """:meth:`first` over a run of records, in order: the indices of the new ones."""
        import numpy as np

        keys = list(zip(boots, seqs, strict=True))
        if self.seen.keys().isdisjoint(keys) and len(set(keys)) == len(keys):
            self.seen.update(zip(keys, digests, strict=True))  # the usual run: all new
            return np.arange(len(keys))
        first = self.first
        new = [i for i, (k, d) in enumerate(zip(keys, digests, strict=True)) if first(*k, d)]
        return np.array(new, dtype=np.intp)


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

"""The driver's side of the aggregation: merging the tasks' partials into the output
tables' rows (percentiles, rates, ranks) and the tables' Spark schemas."""

from __future__ import annotations

import importlib
import math
import shutil
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2p.telemetry._schema import (
    EVENTS,
    HISTOGRAMS,
    percentile,
)
from p2p.telemetry._spark import local_path, scheme

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType, StructType
from p2p.telemetry._accum import (
    _FLEET_NODE,
    DEVICE_COUNTERS,
    FLEET_FIELDS,
    NH,
    _merge_counts,
    _merge_fleet,
    _merge_topic,
    _ts,
)

TABLES = ("devices", "topics", "windows", "fleet", "timeline", "quarantine")
QS = (0.5, 0.95, 0.99)


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


# ------------------------------------------------------------------- writing


def write_tables(
    spark: SparkSession,
    out: str,
    tables: dict[str, list[tuple[Any, ...]]],
    schemas: dict[str, StructType],
    arrow: bool = True,
) -> str:
    """Each table as one Parquet file in ``OUT_DIR/<table>/`` (rows in table order, as
    Spark reads them back with ``schemas``); returns ``"pyarrow"`` or ``"spark"``.

    The rows are already on the driver (a few per key), and OUT_DIR is a path the
    driver writes anyway (``summary.json``), so with pyarrow installed the driver writes
    them itself: a Spark write of local rows costs ~0.5-2 s a table, most of it Spark
    SQL warming up.  Without pyarrow, or for a URI, or ``arrow=False``: one Spark write
    each.
    """
    pa: Any = None
    try:  # (imported by name: pyarrow has no type information for mypy)
        pa = importlib.import_module("pyarrow") if arrow else None
        pq: Any = importlib.import_module("pyarrow.parquet")
    except ImportError:
        pa = None
    if pa is None or scheme(out) not in (None, "file"):
        for name, rows in tables.items():
            spark.sparkContext.setJobDescription(f"write {name}")
            # Local rows are converted on the driver and unpickled by the JVM (no Python
            # worker); coalesce(1) keeps their order in one file without a shuffle.
            frame = spark.createDataFrame(rows, schemas[name], verifySchema=False)
            frame.coalesce(1).write.mode("overwrite").parquet(f"{out.rstrip('/')}/{name}")
        return "spark"
    for name, rows in tables.items():
        folder = Path(local_path(out)) / name
        if folder.exists():
            shutil.rmtree(folder)  # what Spark's overwrite mode does
        folder.mkdir(parents=True)
        fields = schemas[name].fields
        columns = list(zip(*rows, strict=True)) if rows else [()] * len(fields)
        arrays = [
            pa.array(c, _arrow_type(pa, f.dataType)) for c, f in zip(columns, fields, strict=True)
        ]
        names = [f.name for f in fields]
        pq.write_table(pa.Table.from_arrays(arrays, names=names), folder / "part-00000.parquet")
        (folder / "_SUCCESS").touch()
    return "pyarrow"


def _arrow_type(pa: Any, kind: DataType) -> Any:
    """The Arrow type Spark reads back as ``kind`` (timestamps: UTC microseconds)."""
    from pyspark.sql.types import ArrayType, DoubleType, LongType, StringType, TimestampType

    if isinstance(kind, ArrayType):
        return pa.list_(_arrow_type(pa, kind.elementType))
    simple = {LongType: pa.int64(), DoubleType: pa.float64(), StringType: pa.string(),
              TimestampType: pa.timestamp("us", tz="UTC")}  # fmt: skip
    return simple[type(kind)]

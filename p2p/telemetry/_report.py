"""``OUT_DIR/report.html``: one self-contained page (inline SVG, no scripts) from the job's tables.

The tables are small once aggregated; the report collects what it plots to
the driver (top topics, the fleet rows, the most loaded devices, the events
around crashed devices) and draws the charts itself (``p2p.telemetry._charts``),
so it needs nothing beyond the standard library.  Charts (each an ``<svg data-chart="...">``):

``hot-topics``    publications of the hottest topics (bars)
``rates``         fleet publications and deliveries per second over time
``latency``       fleet delivery latency p50 / p95 / p99 over time (log scale)
``events``        crash, suspect, repair and start events per window
``timeline``      crashed devices: crash, suspected by peers, repaired, restarted
``rss``           resident memory of the devices using the most (mean and max)
``cpu``           CPU use of the busiest devices
``fleet-rss``     mean and max resident memory over time
``quarantine``    quarantined items by reason
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2p.telemetry._charts import (
    Point,
    bar_chart,
    esc,
    fmt_bytes,
    line_chart,
    num,
    timeline_chart,
)
from p2p.telemetry._spark import local_path, write_text

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOP_TOPICS = 20
TOP_DEVICES = 15
MAX_LANES = 25


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], cls: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def gather(tables: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The rows the report shows, picked from the job's tables (rows as dicts, each table in
    its written order)."""
    topics = sorted(tables["topics"], key=lambda r: r["hot_rank"])
    fleet = [
        {**r, "ws": r["window_start"].timestamp(), "we": r["window_end"].timestamp()}
        for r in sorted(tables["fleet"], key=lambda r: r["window_start"])
    ]
    devices = tables["devices"]
    timeline = sorted(tables["timeline"], key=lambda r: r["t_unix"])
    crashes: dict[str, list[float]] = {}
    for r in timeline:
        if r["event"] == "crash":
            crashes.setdefault(r["device"], []).append(r["t_unix"])
    crashed = sorted(crashes, key=lambda d: (-len(crashes[d]), min(crashes[d]), d))
    lanes = crashed[:MAX_LANES]
    watched = set(lanes)
    around = [
        r
        for r in timeline
        if r["device"] in watched
        or (r["peer"] in watched and r["event"] in ("suspect", "repair", "unsuspect"))
    ][:5000]
    with_rss = [d for d in devices if d["rss_max_bytes"] is not None]
    with_cpu = [d for d in devices if d["cpu_pct"] is not None]
    quarantine = sorted(
        tables["quarantine"],
        key=lambda r: (r["file"], r["offset"] is not None, r["offset"] or 0),
    )
    return {
        "topics": topics[:TOP_TOPICS],
        "topic_count": len(topics),
        "fleet": fleet,
        "top_rss": sorted(with_rss, key=lambda d: (-d["rss_max_bytes"], d["device"]))[:TOP_DEVICES],
        "top_cpu": sorted(with_cpu, key=lambda d: (-d["cpu_pct"], d["device"]))[:TOP_DEVICES],
        "device_count": len(devices),
        "crash_devices": len(crashed),
        "lanes": lanes,
        "around": around,
        "quarantine_sample": quarantine[:12],
    }


def read_tables(spark: SparkSession, out: str) -> dict[str, list[dict[str, Any]]]:
    """The tables :func:`gather` needs, read back from the Parquet in ``out``."""
    base = out.rstrip("/")
    names = ("topics", "fleet", "devices", "timeline", "quarantine")
    return {n: [r.asDict() for r in spark.read.parquet(f"{base}/{n}").collect()] for n in names}


def render(summary: dict[str, Any], data: dict[str, Any]) -> str:
    """The report page from the summary and :func:`gather`'s rows."""
    topics, fleet = data["topics"], data["fleet"]
    fx = [float(r["ws"]) for r in fleet]

    def over_time(column: str) -> list[Point]:
        """The fleet table's ``column`` per window, as a line chart's points."""
        return list(zip(fx, [r[column] for r in fleet], strict=True))

    charts: list[tuple[str, str, str]] = []

    hot = bar_chart(
        "hot-topics",
        f"Hot topics: publications (top {len(topics)} of {data['topic_count']})",
        [(r["topic"], float(r["publications"]), None) for r in topics],
    )
    charts.append(("Hot topics", hot, _topic_table(topics)))

    rates = line_chart(
        "rates",
        "Fleet message rate",
        [
            ("publications/s", over_time("pub_rate_per_s")),
            ("deliveries/s", over_time("delivery_rate_per_s")),
        ],
        y_label="messages per second",
    )
    charts.append(("Message rate over time", rates, ""))

    latency = line_chart(
        "latency",
        "Fleet delivery latency (bucket upper edges)",
        [(name, over_time(f"latency_{name}_ms")) for name in ("p50", "p95", "p99")],
        y_label="milliseconds (log)",
        log_y=True,
    )
    charts.append(("Latency percentiles over time", latency, ""))

    events = line_chart(
        "events",
        "Events per window",
        [
            (name, list(zip(fx, [float(r[f"event_{name}"]) for r in fleet], strict=True)))
            for name in ("crash", "suspect", "repair", "start")
        ],
        y_label="events",
    )
    span = (min(fx), max(float(r["we"]) for r in fleet)) if fleet else (0.0, 1.0)
    lanes = data["lanes"]
    index = {d: i for i, d in enumerate(lanes)}
    marks = []
    for r in data["around"]:
        lane = index.get(r["device"]) if r["event"] in ("crash", "start", "stop") else None
        if lane is None and r["peer"] in index:
            lane = index[r["peer"]]
        if lane is None:
            continue
        tip = f"{_iso(r['t_unix'])} {r['device']} {r['event']}"
        tip += f" {r['peer']}" if r["peer"] else ""
        tip += f" ({r['detail']})" if r["detail"] else ""
        marks.append((lane, float(r["t_unix"]), r["event"], tip))
    timeline = timeline_chart(
        "timeline",
        f"Crashed devices ({data['crash_devices']}; {len(lanes)} shown) and their repair",
        lanes,
        marks,
        span,
    )
    charts.append(("Crash and repair timeline", events + timeline, ""))

    rss = bar_chart(
        "rss",
        f"Resident memory: the {len(data['top_rss'])} devices using the most",
        [
            (r["device"], float(r["rss_max_bytes"]), float(r["rss_mean_bytes"]))
            for r in data["top_rss"]
        ],
        fmt=fmt_bytes,
        names=("max", "mean"),
    )
    cpu = bar_chart(
        "cpu",
        f"CPU: the {len(data['top_cpu'])} busiest devices (mean % of one core)",
        [(r["device"], float(r["cpu_pct"]), None) for r in data["top_cpu"]],
        fmt=lambda v: f"{v:.1f} %",
    )
    fleet_rss = line_chart(
        "fleet-rss",
        "Fleet resident memory per window",
        [("mean", over_time("rss_mean_bytes")), ("max", over_time("rss_max_bytes"))],
        y_label="bytes",
        y_fmt=fmt_bytes,
    )
    charts.append(("Resource use", rss + cpu + fleet_rss, ""))

    reasons = summary.get("by_reason", {})
    quarantine = bar_chart(
        "quarantine",
        f"Quarantined items by reason ({summary['quarantined']:,} in all)",
        [(k, float(v), None) for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])],
    )
    sample = _table(
        ("file", "offset", "reason", "error"),
        [
            ("/".join(r["file"].rsplit("/", 3)[-3:]), r["offset"], r["reason"], r["error"][:120])
            for r in data["quarantine_sample"]
        ],
        "small",
    )
    charts.append(("Quarantine", quarantine, _reason_table(summary) + sample))

    body = "".join(
        f"<section><h2>{esc(title)}</h2>{svg}{extra}</section>" for title, svg, extra in charts
    )
    return _PAGE.format(
        style=_STYLE,
        head=esc(f"Fleet telemetry report — {summary.get('landing', '')}"),
        numbers=_numbers(summary, data),
        body=body,
    )


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(float(t), dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _topic_table(topics: Sequence[Any]) -> str:
    return _table(
        (
            "rank",
            "topic",
            "devices",
            "publications",
            "deliveries",
            "pub/s",
            "p50 ms",
            "p95 ms",
            "p99 ms",
        ),
        [
            (
                r["hot_rank"],
                r["topic"],
                f"{r['devices']:,}",
                f"{r['publications']:,}",
                f"{r['deliveries']:,}",
                num(r["pub_rate_per_s"], 3),
                num(r["latency_p50_ms"], 2),
                num(r["latency_p95_ms"], 2),
                num(r["latency_p99_ms"], 2),
            )
            for r in topics
        ],
    )


def _reason_table(summary: dict[str, Any]) -> str:
    rows: list[tuple[object, ...]] = [
        (k, f"{v:,}") for k, v in sorted(summary.get("by_reason", {}).items())
    ]
    rows += [(f"invalid: {k}", f"{v:,}") for k, v in summary.get("invalid_by_field", {}).items()]
    return _table(("reason", "items"), rows, "small")


def _numbers(summary: dict[str, Any], data: dict[str, Any]) -> str:
    span = summary.get("span", {})
    timings = summary.get("timings_s", {})
    items = [
        ("records read", f"{summary['records_read']:,}"),
        ("valid", f"{summary['valid']:,}"),
        ("aggregated", f"{summary['aggregated']:,}"),
        ("quarantined", f"{summary['quarantined']:,}"),
        ("duplicates dropped", f"{summary['duplicates_dropped']:,}"),
        ("outside --since/--until", f"{summary['outside_range']:,}"),
        ("devices", f"{data['device_count']:,}"),
        ("topics", f"{data['topic_count']:,}"),
        ("files", f"{summary['files']:,} ({fmt_bytes(summary['bytes'])})"),
        ("from", (span.get("start") or "-").replace("+00:00", "Z")),
        ("to", (span.get("end") or "-").replace("+00:00", "Z")),
        ("window", f"{summary['window_s']:g} s"),
        ("decode time", f"{timings.get('decode', 0):.1f} s"),
    ]
    cells = "".join(
        f'<div class="k"><div class="v">{esc(v)}</div><div class="n">{esc(k)}</div></div>'
        for k, v in items
    )
    return f'<div class="nums">{cells}</div>'


_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;
max-width:960px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.nums{display:flex;flex-wrap:wrap;gap:8px}.k{border:1px solid #ddd;border-radius:6px;
padding:6px 10px;min-width:110px}.v{font-size:17px;font-weight:600}.n{color:#666;font-size:12px}
svg{display:block;margin:10px 0;max-width:100%;height:auto}
svg .t{font-size:14px;font-weight:600}svg .a{font-size:11px;fill:#555}
svg .l{font-size:12px;fill:#222}svg .m{font:11px monospace;fill:#222}
svg .g{stroke:#e6e6e6;stroke-width:1}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;
text-align:right}td:first-child,th:first-child{text-align:left}
table.small{font-size:12px}td:nth-child(2){text-align:left}
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{head}</title>
<style>{style}</style></head>
<body><h1>{head}</h1>
{numbers}
{body}
<p class="n">Percentiles are upper edges of the fixed log-scale histogram buckets, from histograms
merged by element-wise sums. Generated by <code>p2p telemetry aggregate</code>.</p>
</body></html>
"""


def write_report(
    out: str, summary: dict[str, Any], tables: dict[str, list[dict[str, Any]]]
) -> Path:
    """Render ``OUT_DIR/report.html`` from the summary and the job's tables (in memory)."""
    write_text(out, "report.html", render(summary, gather(tables)))
    return Path(local_path(out)) / "report.html"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m p2p.telemetry._report OUT_DIR``: redraw the report from the job's output."""
    import argparse
    import json
    import sys

    from p2p.telemetry._schema import TelemetryError
    from p2p.telemetry._spark import spark_session

    parser = argparse.ArgumentParser(prog="python -m p2p.telemetry._report")
    parser.add_argument("out", metavar="OUT_DIR", help="where p2p telemetry aggregate wrote")
    args = parser.parse_args(argv)
    try:
        summary = json.loads((Path(local_path(args.out)) / "summary.json").read_text())
        spark = spark_session("local[2]", driver_memory="1g")
        try:
            tables = read_tables(spark, args.out)
        finally:
            spark.stop()
        print(write_report(args.out, summary, tables))
    except (OSError, ValueError, TelemetryError) as exc:
        print(f"p2p: error: {exc}", file=sys.stderr)
        return 2
    return 0


__all__ = ["gather", "main", "read_tables", "render", "write_report"]


if __name__ == "__main__":
    raise SystemExit(main())

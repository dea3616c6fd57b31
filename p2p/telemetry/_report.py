"""``OUT_DIR/report.html``: one self-contained page (inline SVG, no scripts) from the job's tables.

The tables are small once aggregated; the report collects what it plots to
the driver (top topics, the fleet rows, the most loaded devices, the events
around crashed devices) and draws the charts itself, so it needs nothing
beyond the standard library.  Charts (each an ``<svg data-chart="...">``):

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
import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2p.telemetry._spark import local_path, write_text

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PALETTE = ("#1f6fb4", "#f28e2b", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
TOP_TOPICS = 20
TOP_DEVICES = 15
MAX_LANES = 25
W, H = 880, 300
ML, MR, MT, MB = 80, 20, 34, 46
"""Chart margins: left, right, top, bottom."""

Point = tuple[float, float | None]


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, int) or (float(x).is_integer() and abs(x) >= 1000):
        return f"{int(x):,}"
    return f"{x:,.{digits}f}"


def _bytes(x: float | None) -> str:
    if x is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x:.0f} B"


# -------------------------------------------------------------------- scales


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering ``[lo, hi]``."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = [round(start, 12)]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(round(start + len(ticks) * step, 12))
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    ticks = []
    for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0**e
            if lo <= v <= hi:
                ticks.append(v)
    return ticks or [lo, hi]


_TIME_STEPS = (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400)


def time_ticks(lo: float, hi: float) -> tuple[list[float], Callable[[float], str]]:
    span = max(hi - lo, 1)
    step = next((s for s in _TIME_STEPS if span / s <= 8), 30 * 86400)
    fmt = "%H:%M" if span <= 2 * 86400 and step < 86400 else "%m-%d %H:%M"
    if step >= 86400:
        fmt = "%Y-%m-%d"
    first = math.ceil(lo / step) * step
    ticks: list[float] = [first + i * step for i in range(int((hi - first) // step) + 1)]

    def label(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.UTC).strftime(fmt)

    return ticks, label


class _Frame:
    """Maps data to pixels for one chart."""

    def __init__(
        self, x: tuple[float, float], y: tuple[float, float], log_y: bool, width: int, height: int
    ) -> None:
        self.x0, self.x1 = x if x[1] > x[0] else (x[0], x[0] + 1)
        self.log_y = log_y
        y0, y1 = y
        if log_y:
            y0, y1 = math.log10(y0), math.log10(y1)
        self.y0, self.y1 = (y0, y1) if y1 > y0 else (y0, y0 + 1)
        self.w, self.h = width, height

    def px(self, x: float) -> float:
        return ML + (x - self.x0) / (self.x1 - self.x0) * (self.w - ML - MR)

    def py(self, y: float) -> float:
        v = math.log10(y) if self.log_y else y
        return self.h - MB - (v - self.y0) / (self.y1 - self.y0) * (self.h - MT - MB)


def _svg_open(chart: str, title: str, width: int, height: int) -> list[str]:
    return [
        f'<svg data-chart="{_esc(chart)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{_esc(title)}"><title>{_esc(title)}</title>',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="{ML}" y="20" class="t">{_esc(title)}</text>',
    ]


def _legend(names: Sequence[str], width: int, colors: Sequence[str] = PALETTE) -> list[str]:
    out = []
    x = width - MR
    for i, name in reversed(list(enumerate(names))):
        x -= 12 + 7 * len(name) + 18
        out.append(
            f'<rect x="{x}" y="11" width="12" height="4" fill="{colors[i % len(colors)]}"/>'
            f'<text x="{x + 16}" y="17" class="l">{_esc(name)}</text>'
        )
    return out


def empty_chart(chart: str, title: str, message: str, width: int = W, height: int = 90) -> str:
    parts = _svg_open(chart, title, width, height)
    parts.append(f'<text x="{ML}" y="55" class="l">{_esc(message)}</text></svg>')
    return "".join(parts)


def line_chart(
    chart: str,
    title: str,
    series: Sequence[tuple[str, Sequence[Point]]],
    *,
    y_label: str,
    log_y: bool = False,
    y_fmt: Callable[[float], str] = lambda v: f"{v:g}",
    width: int = W,
    height: int = H,
) -> str:
    """Lines over time (x in Unix seconds); ``None`` values break a line."""
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts if y is not None and (y > 0 or not log_y)]
    if not xs or not ys:
        return empty_chart(chart, title, "no data")
    if log_y:
        lo, hi = min(ys), max(ys)
        y_range = (10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi)))
        yt = log_ticks(*y_range)
    else:
        yt = nice_ticks(min(0.0, min(ys)), max(ys))
        y_range = (yt[0], yt[-1])
    f = _Frame((min(xs), max(xs)), y_range, log_y, width, height)
    parts = _svg_open(chart, title, width, height)
    for v in yt:
        y = f.py(v)
        parts.append(
            f'<line x1="{ML}" x2="{width - MR}" y1="{y:.1f}" y2="{y:.1f}" class="g"/>'
            f'<text x="{ML - 6}" y="{y + 4:.1f}" class="a" text-anchor="end">'
            f"{_esc(y_fmt(v))}</text>"
        )
    xt, label = time_ticks(f.x0, f.x1)
    for v in xt:
        x = f.px(v)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{MT}" y2="{height - MB}" class="g"/>'
            f'<text x="{x:.1f}" y="{height - MB + 16}" class="a" text-anchor="middle">'
            f"{_esc(label(v))}</text>"
        )
    parts.append(
        f'<text x="12" y="{(height - MB + MT) / 2:.0f}" class="a" text-anchor="middle" '
        f'transform="rotate(-90 12 {(height - MB + MT) / 2:.0f})">{_esc(y_label)}</text>'
        f'<text x="{width - MR}" y="{height - 8}" class="a" text-anchor="end">time (UTC)</text>'
    )
    for i, (_, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        segments: list[list[str]] = [[]]
        for px, py in sorted(pts, key=lambda p: p[0]):
            if py is None or (log_y and py <= 0):
                segments.append([])
                continue
            segments[-1].append(f"{f.px(px):.1f},{f.py(py):.1f}")
        for seg in segments:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>')
            elif seg:
                parts.append(
                    f'<polyline points="{" ".join(seg)}" fill="none" stroke="{color}" '
                    'stroke-width="1.8"/>'
                )
    parts.extend(_legend([name for name, _ in series], width))
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(
    chart: str,
    title: str,
    items: Sequence[tuple[str, float, float | None]],
    *,
    fmt: Callable[[float], str] = lambda v: f"{v:,.0f}",
    names: tuple[str, str] | None = None,
    width: int = W,
) -> str:
    """Horizontal bars, largest first as given; an optional second value as a thinner bar."""
    if not items:
        return empty_chart(chart, title, "no data")
    label_w = min(320, max(80, round(7.6 * max(len(label) for label, _, _ in items)) + 16))
    row = 20
    height = MT + 10 + row * len(items) + 26
    top = max(max(v for _, v, _ in items), max((s or 0) for _, _, s in items))
    ticks = nice_ticks(0, top if top > 0 else 1)
    scale = (width - label_w - MR - 60) / ticks[-1]
    parts = _svg_open(chart, title, width, height)
    base = MT + 10
    for v in ticks:
        x = label_w + v * scale
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{base - 4}" y2="{base + row * len(items)}" '
            f'class="g"/><text x="{x:.1f}" y="{base + row * len(items) + 16}" class="a" '
            f'text-anchor="middle">{_esc(fmt(v))}</text>'
        )
    for i, (label, value, second) in enumerate(items):
        y = base + i * row
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 13}" class="l" text-anchor="end">{_esc(label)}</text>'
            f'<rect x="{label_w}" y="{y + 2}" width="{max(0.5, value * scale):.1f}" height="14" '
            f'fill="{PALETTE[0]}"><title>{_esc(label)}: {_esc(fmt(value))}</title></rect>'
            f'<text x="{label_w + value * scale + 4:.1f}" y="{y + 13}" class="a">'
            f"{_esc(fmt(value))}</text>"
        )
        if second is not None:
            parts.append(
                f'<rect x="{label_w}" y="{y + 7}" width="{max(0.5, second * scale):.1f}" '
                f'height="5" fill="{PALETTE[1]}"><title>{_esc(fmt(second))}</title></rect>'
            )
    if names:
        parts.extend(_legend(list(names), width))
    parts.append("</svg>")
    return "".join(parts)


MARKS = {
    "crash": ("#d62728", "x"),
    "suspect": ("#f28e2b", "triangle"),
    "repair": ("#2ca02c", "circle"),
    "unsuspect": ("#9467bd", "diamond"),
    "start": ("#1f6fb4", "square"),
    "stop": ("#7f7f7f", "square"),
}


def _mark(shape: str, x: float, y: float, color: str, tip: str) -> str:
    tip_el = f"<title>{_esc(tip)}</title>"
    if shape == "x":
        return (
            f'<g stroke="{color}" stroke-width="2">{tip_el}<line x1="{x - 4:.1f}" y1="{y - 4:.1f}" '
            f'x2="{x + 4:.1f}" y2="{y + 4:.1f}"/><line x1="{x - 4:.1f}" y1="{y + 4:.1f}" '
            f'x2="{x + 4:.1f}" y2="{y - 4:.1f}"/></g>'
        )
    if shape == "triangle":
        pts = f"{x:.1f},{y - 5:.1f} {x - 4.5:.1f},{y + 4:.1f} {x + 4.5:.1f},{y + 4:.1f}"
        return f'<polygon points="{pts}" fill="{color}">{tip_el}</polygon>'
    if shape == "diamond":
        pts = f"{x:.1f},{y - 5:.1f} {x + 4:.1f},{y:.1f} {x:.1f},{y + 5:.1f} {x - 4:.1f},{y:.1f}"
        return f'<polygon points="{pts}" fill="{color}">{tip_el}</polygon>'
    if shape == "square":
        return (
            f'<rect x="{x - 3.5:.1f}" y="{y - 3.5:.1f}" width="7" height="7" fill="{color}">'
            f"{tip_el}</rect>"
        )
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}">{tip_el}</circle>'


def timeline_chart(
    chart: str,
    title: str,
    lanes: Sequence[str],
    marks: Sequence[tuple[int, float, str, str]],
    span: tuple[float, float],
    width: int = W,
) -> str:
    """One lane per device; ``marks`` are ``(lane, t, event, tooltip)``."""
    if not lanes:
        return empty_chart(chart, title, "no crashes in this range")
    row = 18
    height = MT + 16 + row * len(lanes) + 40
    label_w = 150
    x0, x1 = span if span[1] > span[0] else (span[0], span[0] + 1)

    def px(t: float) -> float:
        return label_w + (t - x0) / (x1 - x0) * (width - label_w - MR)

    parts = _svg_open(chart, title, width, height)
    base = MT + 16
    xt, label = time_ticks(x0, x1)
    for v in xt:
        x = px(v)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{base - 6}" y2="{base + row * len(lanes)}" '
            f'class="g"/><text x="{x:.1f}" y="{base + row * len(lanes) + 16}" class="a" '
            f'text-anchor="middle">{_esc(label(v))}</text>'
        )
    for i, lane in enumerate(lanes):
        y = base + i * row + row / 2
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 4:.1f}" class="m" text-anchor="end">{_esc(lane)}'
            f'</text><line x1="{label_w}" x2="{width - MR}" y1="{y:.1f}" y2="{y:.1f}" class="g"/>'
        )
    for lane_i, t, event, tip in marks:
        color, shape = MARKS.get(event, ("#444", "circle"))
        parts.append(_mark(shape, px(t), base + lane_i * row + row / 2, color, tip))
    x = float(label_w)
    for event in ("crash", "suspect", "repair", "unsuspect", "start"):
        color, shape = MARKS[event]
        label_text = {"suspect": "suspected by a peer", "repair": "peer repaired tree"}.get(
            event, event
        )
        parts.append(_mark(shape, x + 5, height - 12, color, event))
        parts.append(f'<text x="{x + 13:.1f}" y="{height - 8}" class="l">{_esc(label_text)}</text>')
        x += 30 + 7 * len(label_text)
    parts.append("</svg>")
    return "".join(parts)


# -------------------------------------------------------------------- report


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], cls: str = "") -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in rows)
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
        fmt=_bytes,
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
        y_fmt=_bytes,
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
        f"<section><h2>{_esc(title)}</h2>{svg}{extra}</section>" for title, svg, extra in charts
    )
    return _PAGE.format(
        style=_STYLE,
        head=_esc(f"Fleet telemetry report — {summary.get('landing', '')}"),
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
                _num(r["pub_rate_per_s"], 3),
                _num(r["latency_p50_ms"], 2),
                _num(r["latency_p95_ms"], 2),
                _num(r["latency_p99_ms"], 2),
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
        ("files", f"{summary['files']:,} ({_bytes(summary['bytes'])})"),
        ("from", (span.get("start") or "-").replace("+00:00", "Z")),
        ("to", (span.get("end") or "-").replace("+00:00", "Z")),
        ("window", f"{summary['window_s']:g} s"),
        ("decode time", f"{timings.get('decode', 0):.1f} s"),
    ]
    cells = "".join(
        f'<div class="k"><div class="v">{_esc(v)}</div><div class="n">{_esc(k)}</div></div>'
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


__all__ = [
    "bar_chart",
    "gather",
    "read_tables",
    "line_chart",
    "main",
    "render",
    "timeline_chart",
    "write_report",
]


if __name__ == "__main__":
    raise SystemExit(main())

"""Inline SVG charts for the telemetry report (``p2p.telemetry._report``):
axis ticks for linear, log and time scales, and line, bar and timeline
charts, each one ``<svg data-chart="...">`` string with no script, drawn
with the standard library alone.

Invariant: every text that reaches the page goes through :func:`esc`.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Callable, Sequence

PALETTE = ("#1f6fb4", "#f28e2b", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
W, H = 880, 300
ML, MR, MT, MB = 80, 20, 34, 46
"""Chart margins: left, right, top, bottom."""

Point = tuple[float, float | None]


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, int) or (float(x).is_integer() and abs(x) >= 1000):
        return f"{int(x):,}"
    return f"{x:,.{digits}f}"


def fmt_bytes(x: float | None) -> str:
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
        f'<svg data-chart="{esc(chart)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{esc(title)}"><title>{esc(title)}</title>',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="{ML}" y="20" class="t">{esc(title)}</text>',
    ]


def _legend(names: Sequence[str], width: int, colors: Sequence[str] = PALETTE) -> list[str]:
    out = []
    x = width - MR
    for i, name in reversed(list(enumerate(names))):
        x -= 12 + 7 * len(name) + 18
        out.append(
            f'<rect x="{x}" y="11" width="12" height="4" fill="{colors[i % len(colors)]}"/>'
            f'<text x="{x + 16}" y="17" class="l">{esc(name)}</text>'
        )
    return out


def empty_chart(chart: str, title: str, message: str, width: int = W, height: int = 90) -> str:
    parts = _svg_open(chart, title, width, height)
    parts.append(f'<text x="{ML}" y="55" class="l">{esc(message)}</text></svg>')
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
            f"{esc(y_fmt(v))}</text>"
        )
    xt, label = time_ticks(f.x0, f.x1)
    for v in xt:
        x = f.px(v)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{MT}" y2="{height - MB}" class="g"/>'
            f'<text x="{x:.1f}" y="{height - MB + 16}" class="a" text-anchor="middle">'
            f"{esc(label(v))}</text>"
        )
    parts.append(
        f'<text x="12" y="{(height - MB + MT) / 2:.0f}" class="a" text-anchor="middle" '
        f'transform="rotate(-90 12 {(height - MB + MT) / 2:.0f})">{esc(y_label)}</text>'
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
            f'text-anchor="middle">{esc(fmt(v))}</text>'
        )
    for i, (label, value, second) in enumerate(items):
        y = base + i * row
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 13}" class="l" text-anchor="end">{esc(label)}</text>'
            f'<rect x="{label_w}" y="{y + 2}" width="{max(0.5, value * scale):.1f}" height="14" '
            f'fill="{PALETTE[0]}"><title>{esc(label)}: {esc(fmt(value))}</title></rect>'
            f'<text x="{label_w + value * scale + 4:.1f}" y="{y + 13}" class="a">'
            f"{esc(fmt(value))}</text>"
        )
        if second is not None:
            parts.append(
                f'<rect x="{label_w}" y="{y + 7}" width="{max(0.5, second * scale):.1f}" '
                f'height="5" fill="{PALETTE[1]}"><title>{esc(fmt(second))}</title></rect>'
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
    tip_el = f"<title>{esc(tip)}</title>"
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
            f'text-anchor="middle">{esc(label(v))}</text>'
        )
    for i, lane in enumerate(lanes):
        y = base + i * row + row / 2
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 4:.1f}" class="m" text-anchor="end">{esc(lane)}'
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
        parts.append(f'<text x="{x + 13:.1f}" y="{height - 8}" class="l">{esc(label_text)}</text>')
        x += 30 + 7 * len(label_text)
    parts.append("</svg>")
    return "".join(parts)


# -------------------------------------------------------------------- report


__all__ = [
    "MARKS",
    "PALETTE",
    "Point",
    "bar_chart",
    "empty_chart",
    "esc",
    "fmt_bytes",
    "line_chart",
    "log_ticks",
    "nice_ticks",
    "num",
    "time_ticks",
    "timeline_chart",
]

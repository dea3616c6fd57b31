"""The run's report, built from the map and a run's ledger (:func:`build_report`):
rates and latencies overall and per tile, the order and delivery checks, the
subscriptions, per-player counts, a second-by-second timeline and the targets
met or missed; and the short summary the command prints (:func:`summary_lines`).
Nothing here touches a socket, a clock or trio, so all of it is tested
headless (``tests/test_game.py``).

Invariants: the report only reads the ledger, never changes it, and is
JSON-able (the command writes it with ``--report``).  Only the overall and
per-tile update latencies leave out the warm-up (updates sent before
``start_ns + warmup``); everything else (rates, counts, the checks, the
subscription latency, the timeline) keeps it.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from edge_examples._game_ledger import (
    DeliveryCheck,
    Ledger,
    Pub,
    Receipt,
    Sample,
    check_deliveries,
    check_order,
)
from edge_examples._game_logic import GameMap
from p2p import percentile_of

# ------------------------------------------------------------------ report

TARGETS = ((150.0, 0.95), (200.0, 0.99))
"""The seed's targets (RGame, §2.6.1/§4): 95 % of updates within 150 ms, 99 % within 200 ms."""


def percentile(ordered: Sequence[int], q: float) -> int:
    """Nearest-rank ``q``-th percentile (0 < q <= 100) of an ascending, non-empty list."""
    return percentile_of(ordered, q)


def latency_summary(latencies_us: Iterable[int]) -> dict[str, Any]:
    """p50/p95/p99/max/mean in ms and the share within each target bound."""
    v = sorted(latencies_us)
    if not v:
        return {"count": 0}
    out: dict[str, Any] = {"count": len(v)}
    for name, q in (("p50", 50.0), ("p95", 95.0), ("p99", 99.0)):
        out[name] = round(percentile(v, q) / 1000, 2)
    out["max"] = round(v[-1] / 1000, 2)
    out["mean"] = round(sum(v) / len(v) / 1000, 2)
    for bound_ms, _ in TARGETS:
        limit = bound_ms * 1000
        out[f"within_{bound_ms:g}ms"] = round(_count_le(v, limit) / len(v), 5)
    return out


def _count_le(ordered: Sequence[int], limit: float) -> int:
    lo, hi = 0, len(ordered)
    while lo < hi:
        mid = (lo + hi) // 2
        if ordered[mid] <= limit:
            lo = mid + 1
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class RunInfo:
    """How the run went, for the report: the measured window and the settings."""

    start_ns: int
    """When publishing started (every player's clock is this host's)."""
    duration: float
    warmup: float
    """Seconds at the start left out of latency statistics (rates and checks keep them)."""
    config: dict[str, Any]


def build_report(
    gmap: GameMap, ledger: Ledger, info: RunInfo, *, full: bool = True
) -> dict[str, Any]:
    """The report: per tile and overall rates and latencies, order, delivery, targets.

    ``full``: the ledger holds every player's publications and subscriptions
    (a headless fleet), so deliveries can be checked against them; a single LAN
    player's ledger cannot, and its ``delivery`` section is ``None``.
    """
    cutoff = info.start_ns + int(info.warmup * 1e9)
    measured = [r for r in ledger.receipts if r.sent_ns >= cutoff]
    tiles = _tile_reports(gmap, ledger, measured, info)
    overall = latency_summary(r.latency_us for r in measured)
    order = check_order(ledger.receipts)
    delivery = check_deliveries(ledger) if full else None
    targets: dict[str, Any] = {}
    for bound_ms, share in TARGETS:
        got = overall.get(f"within_{bound_ms:g}ms", 0.0)
        targets[f"{share * 100:g}%_within_{bound_ms:g}ms"] = {
            "target": share,
            "measured": got,
            "met": bool(overall["count"]) and got >= share,
        }
    targets["in_order"] = {"met": order.ok}
    targets["all_met"] = all(t["met"] for t in targets.values())
    return {
        "config": info.config,
        "overall": {
            "updates": len(ledger.pubs),
            "updates_per_s": round(len(ledger.pubs) / info.duration, 1),
            "receipts": len(ledger.receipts),
            "receipts_per_s": round(len(ledger.receipts) / info.duration, 1),
            "latency_ms": overall,
        },
        "tiles": tiles,
        "in_order": {
            "ok": order.ok,
            "violations": order.violations,
            "streams_checked": order.streams,
            "cross_tile_stale": order.cross_tile_stale,
        },
        "delivery": _delivery_report(delivery, ledger),
        "subscriptions": _subscription_report(ledger),
        "players": _player_reports(gmap, ledger, info),
        "targets": targets,
        "node_stats": ledger.stats,
        "cpu_s": round(ledger.cpu_s, 2),
        "timeline": timeline(ledger, info.start_ns),
    }


def _delivery_report(check: DeliveryCheck | None, ledger: Ledger) -> dict[str, Any] | None:
    if check is None:
        return None
    return {
        "ok": check.ok and not ledger.dropped,
        "receipts": check.receipts,
        "expected_min": check.expected_min,
        "expected_max": check.expected_max,
        "missing": check.missing,
        "unexpected": check.unexpected,
        "duplicates": check.duplicates,
        "dropped_by_slow_reader": ledger.dropped,
        "foreign_payloads": ledger.foreign,
    }


def _tile_reports(
    gmap: GameMap, ledger: Ledger, measured: list[Receipt], info: RunInfo
) -> dict[str, Any]:
    pubs: dict[int, list[Pub]] = defaultdict(list)
    for p in ledger.pubs:
        pubs[p.tile].append(p)
    lat: dict[int, list[int]] = defaultdict(list)
    for r in measured:
        lat[r.tile].append(r.latency_us)
    count: dict[int, int] = defaultdict(int)
    subscribers: dict[int, set[int]] = defaultdict(set)
    for r in ledger.receipts:
        count[r.tile] += 1
    for iv in ledger.intervals:
        subscribers[iv.tile].add(iv.player)
    out: dict[str, Any] = {}
    for tile in gmap.tiles():
        i = gmap.index(tile)
        if not pubs.get(i) and not count.get(i):
            continue
        out[gmap.topic(tile)] = {
            "publishers": len({p.player for p in pubs[i]}),
            "peak_publishers": _peak_publishers(pubs[i]),
            "subscribers": len(subscribers[i]),
            "updates": len(pubs[i]),
            "updates_per_s": round(len(pubs[i]) / info.duration, 1),
            "receipts": count[i],
            "receipts_per_s": round(count[i] / info.duration, 1),
            "latency_ms": latency_summary(lat[i]),
        }
    return out


def _peak_publishers(pubs: list[Pub]) -> int:
    """The most distinct players publishing on the tile within one second."""
    per_second: dict[int, set[int]] = defaultdict(set)
    for p in pubs:
        per_second[p.sent_ns // 1_000_000_000].add(p.player)
    return max((len(s) for s in per_second.values()), default=0)


def _subscription_report(ledger: Ledger) -> dict[str, Any]:
    waits = [iv.acked_ns - iv.call_ns for iv in ledger.intervals if iv.acked_ns is not None]
    return {
        "subscribes": len(ledger.intervals),
        "unsubscribes": sum(iv.end_ns is not None for iv in ledger.intervals),
        "never_acked": sum(iv.acked_ns is None for iv in ledger.intervals),
        "subscribe_latency_ms": latency_summary(w // 1000 for w in waits),
    }


def _player_reports(gmap: GameMap, ledger: Ledger, info: RunInfo) -> dict[str, Any]:
    by_player: dict[int, list[Pub]] = defaultdict(list)
    for p in ledger.pubs:
        by_player[p.player].append(p)
    out: dict[str, Any] = {}
    for player, pubs in sorted(by_player.items(), key=lambda kv: ledger.names.get(kv[0], "")):
        changes = sum(a.tile != b.tile for a, b in itertools.pairwise(pubs))
        last = gmap.tile_at(pubs[-1].tile)
        out[ledger.names.get(player, f"{player:016x}")] = {
            "id": f"{player:016x}",
            "updates": len(pubs),
            "updates_per_s": round(len(pubs) / info.duration, 1),
            "tile_changes": changes,
            "final_tile": f"{last.col},{last.row}",
        }
    return out


def timeline(ledger: Ledger, start_ns: int) -> list[dict[str, Any]]:
    """Second by second from ``start_ns``: updates sent, their receipts and latency,
    the game's CPU (% of one core, all its processes) and the host's (% of all
    cores, everything running on it).  Shows whether a latency spike came with
    a CPU shortage on a shared host."""
    updates: dict[int, int] = defaultdict(int)
    for p in ledger.pubs:
        updates[(p.sent_ns - start_ns) // 1_000_000_000] += 1
    lat: dict[int, list[int]] = defaultdict(list)
    for r in ledger.receipts:
        lat[(r.sent_ns - start_ns) // 1_000_000_000].append(r.latency_us)
    cpu, host = _cpu_per_second(ledger.samples, start_ns)
    rows = []
    for k in sorted(set(updates) | set(lat)):
        if k < 0:
            continue
        v = sorted(lat.get(k, []))
        row: dict[str, Any] = {"t": k, "updates": updates.get(k, 0), "receipts": len(v)}
        if v:
            row["p50_ms"] = round(percentile(v, 50) / 1000, 1)
            row["p99_ms"] = round(percentile(v, 99) / 1000, 1)
            row["max_ms"] = round(v[-1] / 1000, 1)
        if k in cpu:
            row["game_cpu_pct"] = cpu[k]
        if k in host:
            row["host_busy_pct"] = host[k]
        rows.append(row)
    return rows


def _cpu_per_second(
    samples: list[list[Sample]], start_ns: int
) -> tuple[dict[int, float], dict[int, float]]:
    cpu: dict[int, float] = defaultdict(float)
    host: dict[int, float] = {}
    for n, shard in enumerate(samples):
        for a, b in itertools.pairwise(shard):
            k = round((a.t_ns - start_ns) / 1e9)
            wall = (b.t_ns - a.t_ns) / 1e9
            if wall > 0:
                cpu[k] += round(100 * (b.cpu_s - a.cpu_s) / wall, 1)
            total = b.host_total - a.host_total
            if n == 0 and total > 0:
                host[k] = round(100 * (b.host_busy - a.host_busy) / total, 1)
    return dict(cpu), host


def summary_lines(report: dict[str, Any]) -> list[str]:
    """A short human summary of ``report`` (what the command prints)."""
    cfg, ov = report["config"], report["overall"]
    lat = ov["latency_ms"]
    crowd = f"crowd {cfg['crowd']} on tile {cfg['hot_tile']}, " if "crowd" in cfg else ""
    where = f"{cfg['procs']} process(es)" if "procs" in cfg else f"as seen by {cfg.get('node')}"
    lines = [
        f"{cfg.get('players', '?')} players, {cfg.get('rate', '?')} Hz, {crowd}"
        f"{cfg.get('duration', '?')} s, {where}",
        f"updates: {ov['updates']} ({ov['updates_per_s']}/s), receipts: {ov['receipts']} "
        f"({ov['receipts_per_s']}/s)",
    ]
    if lat.get("count"):
        lines.append(
            f"latency ms: p50 {lat['p50']} p95 {lat['p95']} p99 {lat['p99']} max {lat['max']}"
            f" (after {cfg.get('warmup', 0)} s warm-up)"
        )
    hot = sorted(report["tiles"].items(), key=lambda kv: -kv[1]["peak_publishers"])[:3]
    for topic, t in hot:
        tl = t["latency_ms"]
        p95 = tl.get("p95", "-")
        lines.append(
            f"  {topic}: {t['peak_publishers']} publishers, {t['updates_per_s']} updates/s, "
            f"{t['receipts']} receipts, p95 {p95} ms"
        )
    o, d = report["in_order"], report["delivery"]
    lines.append(
        f"in order: {'yes' if o['ok'] else 'NO'} ({o['violations']} violations, "
        f"{o['cross_tile_stale']} stale across tiles)"
    )
    if d is not None:
        lines.append(
            f"delivery: {'ok' if d['ok'] else 'FAILED'} ({d['receipts']} receipts, expected "
            f"{d['expected_min']}..{d['expected_max']}; missing {d['missing']}, unexpected "
            f"{d['unexpected']}, duplicates {d['duplicates']}, dropped "
            f"{d['dropped_by_slow_reader']})"
        )
    for name, t in report["targets"].items():
        if name in ("all_met", "in_order"):
            continue
        lines.append(
            f"target {name}: {'met' if t['met'] else 'MISSED'} "
            f"(measured {t['measured'] * 100:.2f} %)"
        )
    return lines

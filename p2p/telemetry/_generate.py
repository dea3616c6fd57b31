"""Synthetic fleet telemetry in the landing layout: ``p2p telemetry generate``.

Writes what a fleet's collector would have landed (see :mod:`p2p.telemetry`)::

    OUT/date=YYYY-MM-DD/device=<16 hex>/<boot 8>-<first seq 12>.cbor

named like the collector names its files (zero-padded boot and first seq).
Pure Python, no Spark; deterministic: the same ``seed`` and arguments give
byte-identical files whatever ``jobs`` is (each device has its own seeded
:class:`random.Random`, and the fleet-wide plan of crashes and suspicions is
drawn first from the seed alone).

The fleet (all numbers are module constants below):

* **Windows.** Every device writes one ``node`` record per ``window`` (60 s by
  default) and one ``topic`` record per active topic, on its own phase.  At
  the default settings a device averages about 6 records per window, so
  1,000 devices x 24 h is about 8.6 M records (one per 10 s per device).
* **Skewed topics.**  :data:`N_TOPICS` topics with Zipf(:data:`ZIPF_S`)
  popularity: each device subscribes to :data:`SUBSCRIPTIONS` of them drawn by
  popularity; hot topics are active more often and carry more deliveries.
* **Diurnal load.**  ``1 + 0.6 sin(2 pi (hour - 9) / 24)`` (UTC): peak 1.6 at
  15:00, trough 0.4 at 03:00.  It scales topic activity, deliveries, CPU and
  packets; above 1.35 latency shifts to the next (slower) profile.
* **Latency.**  Histograms are drawn from log-normal profiles (medians 2 to
  65 ms, 2 % slow tail), precomputed per (profile, count) so a record costs
  one CBOR encode.  ``sum(latency) == deliveries``, ``sum(holdback) == held``,
  ``sum(ack_round) == publications``.
* **Lifecycle.**  :data:`P_CRASHY` of the devices crash 1 to 3 times (a
  ``crash`` event, 30 s to 10 min down, then ``start`` with ``boot + 1``,
  ``seq`` from 0); 2 to 4 peers ``suspect`` the crashed device and ``repair``
  the tree, one ``unsuspect``\\ s it after the restart.  :data:`P_LATE_JOIN`
  join late (``start``, ``join``), :data:`P_EARLY_LEAVE` leave early (``leave``,
  ``stop``); about :data:`FALSE_SUSPICIONS` false suspicions per device-hour
  (``suspect`` then ``unsuspect``).  Node records count the window's
  suspicions and repairs.

Corruption (counted exactly in the returned stats):

* :data:`P_TORN_CRASH` of the files cut by a crash, and :data:`P_TORN_FILE`
  of the others, end with a truncated record (a strict prefix of a CBOR item);
* :data:`P_INVALID` of the records break the schema (a negative or float
  counter, NaN CPU, a short histogram, an unknown key, a wrong id, an unknown
  event);
* :data:`P_VERSION` of the records have ``v = 2``;
* :data:`P_OVERLAP` of the files (with >= 100 records) are landed twice with an
  overlap (a re-upload after a partial acknowledgement): 10 to 60 records
  appear in two files.  Duplicates are valid; the job keeps one.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cbor2

from p2p.telemetry._schema import BUCKETS, SCHEMA_VERSION, TelemetryError, bucket, record_id

DEFAULT_START = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
"""Default first instant (a Monday, 00:00 UTC): fixed, so output never depends on the clock."""

WINDOW = 60.0
TOPIC_RECORDS = 5.23
"""Mean active topics per device-window at load 1 (plus the node record: ~6 records)."""
N_TOPICS = 200
ZIPF_S = 1.1
SUBSCRIPTIONS = 12
P_CRASHY = 0.03
P_LATE_JOIN = 0.02
P_EARLY_LEAVE = 0.01
P_SPOOL_DROPPED = 0.005
FALSE_SUSPICIONS = 0.002
"""Per device-hour."""
P_INVALID = 0.0005
P_VERSION = 0.0002
P_TORN_CRASH = 0.5
P_TORN_FILE = 0.01
P_OVERLAP = 0.02
HIST_CAP = 256
"""Largest count a generated histogram holds (deliveries are capped to it)."""
VARIANTS = 4
LATENCY_MEDIANS = (2.0, 3.5, 6.0, 10.0, 16.0, 25.0, 40.0, 65.0)
"""Milliseconds, one per latency profile (ACK rounds: 2.5 times these)."""
CATEGORIES = ("sensors", "chat", "alerts", "metrics", "cmd", "video", "logs", "game")
WORDS = ("room", "floor", "line", "zone", "cell", "bay", "lab", "yard", "hall", "dock")
CRASHES = ("watchdog reset", "kernel panic", "power loss", "out of memory")

_K_LAT = cbor2.dumps("latency")
_K_HOLD = cbor2.dumps("holdback")
_K_ACK = cbor2.dumps("ack_round")


def load(t: float) -> float:
    """Diurnal load factor at Unix time ``t`` (UTC hour of day)."""
    hour = (t % 86400) / 3600
    return 1 + 0.6 * math.sin(2 * math.pi * (hour - 9) / 24)


def topic_catalogue(seed: int) -> list[str]:
    """:data:`N_TOPICS` topic names, hottest first (the order depends on the seed)."""
    rng = random.Random(f"{seed}/topics")
    names = [
        f"{CATEGORIES[i % len(CATEGORIES)]}/{WORDS[(i // len(CATEGORIES)) % len(WORDS)]}-{i:03d}"
        for i in range(N_TOPICS)
    ]
    rng.shuffle(names)
    return names


def zipf_weights(n: int = N_TOPICS, s: float = ZIPF_S) -> list[float]:
    return [1 / (r + 1) ** s for r in range(n)]


# ------------------------------------------------------------------ the plan


@dataclass(slots=True)
class DevicePlan:
    """What happens to one device, drawn from the seed before any record is written."""

    idx: int
    device: str
    boot: int
    seq: int
    phase: float
    join: float | None = None
    leave: float | None = None
    happenings: list[tuple[float, str, str | None, str | None]] = field(default_factory=list)
    """``(t, what, peer, detail)``; ``what`` is an event name, ``crash``, ``restart``, ``join``
    or ``leave``."""


@dataclass(frozen=True, slots=True)
class Config:
    out: str
    seed: int
    start: float
    end: float
    window: float


def plan_fleet(devices: int, start: float, end: float, seed: int) -> list[DevicePlan]:
    """Devices, their lifecycles, crashes and the suspicions they cause."""
    rng = random.Random(f"{seed}/plan")
    ids: set[str] = set()
    plans = []
    span = end - start
    for idx in range(devices):
        device = f"{rng.getrandbits(64):016x}"
        while device in ids:
            device = f"{rng.getrandbits(64):016x}"
        ids.add(device)
        boot = rng.randint(0, 4)
        plan = DevicePlan(idx, device, boot, rng.randint(0, 50_000), rng.uniform(0, 60))
        plans.append(plan)
        u = rng.random()
        if u < P_LATE_JOIN:
            plan.join = start + rng.uniform(0.05, 0.8) * span
            plan.boot, plan.seq = boot + 1, 0
            plan.happenings.append((plan.join, "join", None, "late join"))
        elif u < P_LATE_JOIN + P_EARLY_LEAVE:
            plan.leave = start + rng.uniform(0.2, 0.95) * span
            plan.happenings.append((plan.leave, "leave", None, "decommissioned"))
        elif u < P_LATE_JOIN + P_EARLY_LEAVE + P_CRASHY:
            for _ in range(rng.randint(1, 3)):
                tc = start + rng.uniform(0.02, 0.95) * span
                if any(abs(tc - h[0]) < 900 for h in plan.happenings):
                    continue
                down = rng.uniform(30, 600)
                detail = rng.choice(CRASHES)
                plan.happenings.append((tc, "crash", None, detail))
                plan.happenings.append((tc + down, "restart", None, None))
        if rng.random() < P_SPOOL_DROPPED:
            t = start + rng.uniform(0.1, 0.9) * span
            plan.happenings.append((t, "spool_dropped", None, f"{rng.randint(10, 900)} records"))
    for plan in plans:  # peers notice crashes
        for t, what, _, _ in list(plan.happenings):
            if what == "crash" and devices > 1:
                peers = rng.sample([p for p in plans if p is not plan], min(devices - 1, 4))
                for k, peer in enumerate(peers[: rng.randint(2, 4)]):
                    ts = t + rng.uniform(3, 15)
                    peer.happenings.append((ts, "suspect", plan.device, "no heartbeat"))
                    peer.happenings.append(
                        (ts + rng.uniform(10, 30), "repair", plan.device, "tree repaired")
                    )
                    if k == 0:
                        restart = min(
                            h[0] for h in plan.happenings if h[1] == "restart" and h[0] > t
                        )
                        peer.happenings.append(
                            (restart + rng.uniform(1, 5), "unsuspect", plan.device, "back")
                        )
    false = round(devices * span / 3600 * FALSE_SUSPICIONS)
    for _ in range(false if devices > 1 else 0):
        a, b = rng.sample(plans, 2)
        ts = start + rng.uniform(0, span)
        a.happenings.append((ts, "suspect", b.device, "slow heartbeat"))
        a.happenings.append((ts + rng.uniform(5, 20), "unsuspect", b.device, "heartbeat resumed"))
    for plan in plans:
        plan.happenings.sort(key=lambda h: h[0])
    return plans


# ------------------------------------------------------------- histograms


class _Hists:
    """Encoded histograms per (profile, count, variant): a record costs no histogram work."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(f"{seed}/histograms")
        self.latency = [self._chains(rng, m, 0.6) for m in LATENCY_MEDIANS]
        self.ack = [self._chains(rng, 2.5 * m, 0.5) for m in LATENCY_MEDIANS]
        self.holdback = self._chains(rng, 3.0, 0.8)

    @staticmethod
    def _chains(rng: random.Random, median: float, sigma: float) -> list[list[bytes]]:
        """``out[n][v]``: variant ``v`` of a histogram of ``n`` draws, CBOR-encoded."""
        out: list[list[bytes]] = [[] for _ in range(HIST_CAP + 1)]
        for _ in range(VARIANTS):
            hist = [0] * (BUCKETS + 1)
            out[0].append(cbor2.dumps(hist))
            for n in range(1, HIST_CAP + 1):
                value = median * math.exp(sigma * rng.gauss(0, 1))
                if rng.random() < 0.02:
                    value *= 8
                hist[bucket(value)] += 1
                out[n].append(cbor2.dumps(hist))
        return out


_HISTS: dict[int, _Hists] = {}


def _hists(seed: int) -> _Hists:
    if seed not in _HISTS:
        _HISTS.clear()
        _HISTS[seed] = _Hists(seed)
    return _HISTS[seed]


# ------------------------------------------------------------------ writing


class _Writer:
    """One device's landing files: a new file per (UTC day, boot)."""

    def __init__(self, cfg: Config, device: str, rng: random.Random, stats: Counter[str]) -> None:
        self.root = Path(cfg.out)
        self.device = device
        self.rng = rng
        self.stats = stats
        self.key: tuple[int, int] | None = None
        self.parts: list[tuple[int, bytes, str]] = []
        self.days: dict[int, str] = {}

    def add(self, t: float, boot: int, seq: int, data: tuple[bytes, str]) -> None:
        """Append a record (its bytes and corruption tag) to the (day, boot) file."""
        key = (int(t // 86400), boot)
        if key != self.key:
            self.close(P_TORN_FILE)
            self.key = key
        self.parts.append((seq, *data))

    def _day(self, day: int) -> str:
        name = self.days.get(day)
        if name is None:
            name = self.days[day] = (
                dt.datetime.fromtimestamp(day * 86400, dt.UTC).date().isoformat()
            )
        return name

    def close(self, p_torn: float) -> None:
        if self.key is None or not self.parts:
            return
        day, boot = self.key
        folder = self.root / f"date={self._day(day)}" / f"device={self.device}"
        folder.mkdir(parents=True, exist_ok=True)
        parts = self.parts
        files = [parts]
        n = len(parts)
        if n >= 100 and self.rng.random() < P_OVERLAP:
            k = self.rng.randint(n // 4, 3 * n // 4)
            d = self.rng.randint(10, 60)
            files = [parts[: k + d], parts[k:]]
            self.stats["duplicates"] += d
            for _, _, tag in parts[k : k + d]:
                if tag:
                    self.stats[f"duplicated_{tag}"] += 1
        for i, chunk in enumerate(files):
            data = b"".join(p[1] for p in chunk)
            if i == len(files) - 1 and self.rng.random() < p_torn:
                last = chunk[-1][1]
                data += last[: self.rng.randint(1, len(last) - 1)]
                self.stats["torn"] += 1
            (folder / f"{boot:08d}-{chunk[0][0]:012d}.cbor").write_bytes(data)
            self.stats["files"] += 1
            self.stats["bytes"] += len(data)
        self.parts = []
        self.key = None


# ------------------------------------------------------------------ devices


_MUTATIONS: dict[str, tuple[tuple[str, Any], ...]] = {
    "node": (("packets_sent", -1), ("cpu_s", float("nan")), ("rss", 1), ("id", "garbled")),
    "topic": (("publications", -3), ("held", 1.5), ("latency", [0] * BUCKETS), ("rss", 1)),
    "event": (("event", "explode"), ("id", "garbled"), ("peer", "ZZ")),
}


def _encode(
    rec: dict[str, Any], rng: random.Random, stats: Counter[str], tail: bytes = b""
) -> tuple[bytes, str]:
    """``rec`` (+ pre-encoded histograms ``tail``) as CBOR, corrupted at the documented rates.

    Returns the bytes and ``""``, ``"invalid"`` or ``"bad_version"``.  With a
    ``tail`` (three more map entries), the map header of ``rec``'s encoding is
    raised by 3 and the entries appended: the same bytes as encoding the whole map.
    """
    u = rng.random()
    if u >= P_VERSION + P_INVALID:
        if not tail:
            return cbor2.dumps(rec), ""
        head = cbor2.dumps(rec)
        return bytes((head[0] + 3,)) + head[1:] + tail, ""
    if tail:
        rec = {**rec, **cbor2.loads(bytes((0xA3,)) + tail)}
    if u < P_VERSION:
        stats["bad_version"] += 1
        return cbor2.dumps({**rec, "v": SCHEMA_VERSION + 1}), "bad_version"
    stats["invalid"] += 1
    key, value = rng.choice(_MUTATIONS[rec["kind"]])
    return cbor2.dumps({**rec, key: value}), "invalid"


def _generate_device(cfg: Config, plan: DevicePlan, topics: list[str], stats: Counter[str]) -> None:
    rng = random.Random(f"{cfg.seed}/device/{plan.idx}")
    hists = _hists(cfg.seed)
    writer = _Writer(cfg, plan.device, rng, stats)
    device, window = plan.device, cfg.window
    weights = zipf_weights()
    cum = [sum(weights[: i + 1]) for i in range(len(weights))]
    subs: list[int] = []
    while len(subs) < SUBSCRIPTIONS:
        r = rng.choices(range(N_TOPICS), cum_weights=cum)[0]
        if r not in subs:
            subs.append(r)
    raw = [weights[r] ** 0.3 for r in subs]
    activity = [TOPIC_RECORDS * a / sum(raw) for a in raw]
    volume = [3 + 60 * weights[r] ** 0.5 for r in subs]
    publisher = [rng.random() < 0.25 for _ in subs]
    profile = [min(7, r % 5 + (1 if r < 5 else 0)) for r in subs]
    hold_ratio = [rng.uniform(0.01, 0.08) for _ in subs]
    rss_base = rng.uniform(25e6, 90e6)
    leak = rng.uniform(200, 2000) if any(h[3] == "out of memory" for h in plan.happenings) else 0.0
    cpu_factor = rng.uniform(0.5, 2.0)
    conns = rng.randint(3, 12)
    size = rng.uniform(180, 500)

    boot, seq = plan.boot, plan.seq
    alive = plan.join is None
    since = -math.inf if alive else math.inf
    boot_t = cfg.start
    suspicions = repairs = 0
    happenings = plan.happenings
    hi = 0

    def emit(t: float, event: str, peer: str | None = None, detail: str | None = None) -> None:
        nonlocal seq
        rec: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "id": record_id(device, boot, seq),
            "device": device,
            "boot": boot,
            "seq": seq,
            "t": round(t, 3),
            "window": 0.0,
            "kind": "event",
            "event": event,
        }
        if peer is not None:
            rec["peer"] = peer
        if detail is not None:
            rec["detail"] = detail
        writer.add(t, boot, seq, _encode(rec, rng, stats))
        stats["records"] += 1
        stats[f"event_{event}"] += 1
        seq += 1

    k = 1
    base = cfg.start + plan.phase
    while True:
        te = base + k * window
        if te > cfg.end:
            break
        k += 1
        while hi < len(happenings) and happenings[hi][0] <= te:
            t, what, peer, detail = happenings[hi]
            hi += 1
            if what in ("restart", "join"):
                if what == "restart":
                    boot, seq = boot + 1, 0
                alive, since, boot_t = True, t, t
                emit(t, "start", detail=f"boot {boot}")
                if what == "join":
                    emit(t, "join")
            elif not alive:
                continue
            elif what == "crash":
                emit(t, "crash", detail=detail)
                writer.close(P_TORN_CRASH)
                alive = False
            elif what == "leave":
                emit(t, "leave", detail=detail)
                emit(t, "stop")
                writer.close(P_TORN_FILE)
                alive = False
                since = math.inf
            else:
                emit(t, what, peer, detail)
                suspicions += what == "suspect"
                repairs += what == "repair"
        if not alive or te - window < since:
            continue
        lf = load(te)
        shift = 1 if lf > 1.35 else 0
        tr = round(te, 3)
        topic_recs: list[tuple[dict[str, Any], bytes]] = []
        pubs_total = deliveries_total = 0
        for j, r in enumerate(subs):
            if rng.random() >= activity[j] * lf:
                continue
            deliveries = min(HIST_CAP, max(1, int(volume[j] * lf * (0.5 + rng.random()))))
            pubs = int(deliveries * 0.15 * (0.5 + rng.random())) if publisher[j] else 0
            held = int(deliveries * hold_ratio[j] * 2 * rng.random())
            v = rng.randrange(VARIANTS)
            p = min(7, profile[j] + shift)
            tail = (
                _K_LAT
                + hists.latency[p][deliveries][v]
                + _K_HOLD
                + hists.holdback[held][v]
                + _K_ACK
                + hists.ack[p][pubs][v]
            )
            rec = {
                "v": SCHEMA_VERSION,
                "id": "",
                "device": device,
                "boot": boot,
                "seq": 0,
                "t": tr,
                "window": window,
                "kind": "topic",
                "topic": topics[r],
                "publications": pubs,
                "deliveries": deliveries,
                "held": held,
            }
            topic_recs.append((rec, tail))
            pubs_total += pubs
            deliveries_total += deliveries
        received = int(deliveries_total * 1.2 + 5 * conns * lf)
        sent = int(pubs_total * 3 + deliveries_total * 0.9 + 5 * conns * lf)
        node: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "id": record_id(device, boot, seq),
            "device": device,
            "boot": boot,
            "seq": seq,
            "t": tr,
            "window": window,
            "kind": "node",
            "rss_bytes": int(rss_base + leak * (te - boot_t) + 2e6 * lf + rng.uniform(0, 1e6)),
            "cpu_s": round(
                window * (0.01 + 0.04 * lf * cpu_factor) * (0.8 + 0.4 * rng.random()), 4
            ),
            "connections": max(1, conns + rng.randint(-1, 1)),
            "packets_sent": sent,
            "packets_received": received,
            "frames_sent": int(sent * 0.7) + 1,
            "frames_received": int(received * 0.7) + 1,
            "bytes_sent": int(sent * size),
            "bytes_received": int(received * size),
            "suspicions": suspicions,
            "repairs": repairs,
            "rejected": 1 if rng.random() < 0.001 else 0,
            "dropped": rng.randint(1, 5) if rng.random() < 0.003 * lf else 0,
        }
        suspicions = repairs = 0
        writer.add(te, boot, seq, _encode(node, rng, stats))
        seq += 1
        for rec, tail in topic_recs:
            rec["id"] = record_id(device, boot, seq)
            rec["seq"] = seq
            writer.add(te, boot, seq, _encode(rec, rng, stats, tail))
            seq += 1
        stats["records"] += 1 + len(topic_recs)
        stats["windows"] += 1
    writer.close(P_TORN_FILE)


def _run_chunk(cfg: Config, plans: list[DevicePlan]) -> dict[str, int]:
    stats: Counter[str] = Counter()
    topics = topic_catalogue(cfg.seed)
    for plan in plans:
        _generate_device(cfg, plan, topics, stats)
        stats["devices"] += 1
    return dict(stats)


# --------------------------------------------------------------------- entry


_ALWAYS = (
    "bad_version",
    "bytes",
    "devices",
    "duplicated_bad_version",
    "duplicated_invalid",
    "duplicates",
    "files",
    "invalid",
    "records",
    "torn",
    "windows",
)


def parse_time(text: str) -> float:
    """An ISO date or datetime (naive means UTC) as Unix seconds."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise TelemetryError(f"not an ISO date or datetime: {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def generate(
    out: str | Path,
    *,
    devices: int,
    hours: float,
    seed: int = 0,
    start: float | None = None,
    window: float = WINDOW,
    jobs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write ``devices`` x ``hours`` of synthetic telemetry under ``out``; return the counts.

    The counts: ``records`` (every item written, corrupt ones included),
    ``invalid``, ``bad_version``, ``torn`` (files ending with a truncated
    record), ``duplicates`` (records landed twice), ``files``, ``bytes``,
    ``windows``, ``event_<name>`` and ``seconds``.
    """
    if not 1 <= devices <= 1_000_000:
        raise TelemetryError(f"--devices must be between 1 and 1000000, got {devices}")
    if not 0 < hours <= 24 * 366:
        raise TelemetryError(f"--hours must be in (0, 8784], got {hours}")
    if not 1 <= window <= 3600:
        raise TelemetryError(f"--window must be between 1 and 3600 seconds, got {window}")
    root = Path(out)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise TelemetryError(f"{root} exists and is not an empty directory")
    root.mkdir(parents=True, exist_ok=True)
    t0 = DEFAULT_START.timestamp() if start is None else start
    cfg = Config(str(root), seed, t0, t0 + hours * 3600, window)
    started = time.perf_counter()
    plans = plan_fleet(devices, cfg.start, cfg.end, seed)
    jobs = max(1, min(jobs or os.cpu_count() or 1, devices))
    size = max(1, min(50, math.ceil(devices / (jobs * 8))))
    chunks = [plans[i : i + size] for i in range(0, devices, size)]
    stats: Counter[str] = Counter()
    last = started

    def done(part: dict[str, int]) -> None:
        nonlocal last
        stats.update(part)
        now = time.perf_counter()
        if progress and (now - last > 2 or stats["devices"] == devices):
            last = now
            progress(
                f"generate: {stats['devices']}/{devices} devices, "
                f"{stats['records'] / 1e6:.2f} M records, {now - started:.0f} s"
            )

    if jobs == 1:
        for chunk in chunks:
            done(_run_chunk(cfg, chunk))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(_run_chunk, cfg, chunk) for chunk in chunks]
            for fut in as_completed(futures):
                done(fut.result())
    for key in _ALWAYS:
        stats[key] += 0
    result: dict[str, Any] = dict(sorted(stats.items()))
    result["seconds"] = round(time.perf_counter() - started, 3)
    return result


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


__all__ = ["DEFAULT_START", "generate", "load", "parse_time", "plan_fleet", "topic_catalogue"]

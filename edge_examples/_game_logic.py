"""The game's pure logic: the tiled map, state updates, bot movement, the run's
ledger and the report.  Nothing here touches a socket, a clock or trio, so all
of it is tested headless (``tests/test_game.py``).

The map is ``cols x rows`` square tiles of ``tile_size`` cells.  Each tile is a
topic (:meth:`GameMap.topic`).  A player publishes its state to the tile it
stands on and subscribes to every tile within ``radius`` tiles of it (its
*neighbourhood*, a 3x3 block for ``radius=1``, clipped at the map's edges).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import struct
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from p2p import percentile_of

# ------------------------------------------------------------------ the map


class Tile(NamedTuple):
    """A tile's column and row (``0 <= col < cols``, ``0 <= row < rows``)."""

    col: int
    row: int


@dataclass(frozen=True, slots=True)
class GameMap:
    """Geometry of the world.  Invariant: every cell belongs to exactly one tile,
    and every tile is in its own neighbourhood."""

    cols: int = 4
    rows: int = 4
    tile_size: int = 8
    radius: int = 1
    name: str = "game"
    """Prefix of every topic, so two games on one fleet never mix."""

    def __post_init__(self) -> None:
        if not (1 <= self.cols <= 64 and 1 <= self.rows <= 64):
            raise ValueError(f"map must be 1..64 tiles each way, got {self.cols}x{self.rows}")
        if not 2 <= self.tile_size <= 256:
            raise ValueError(f"tile size must be 2..256 cells, got {self.tile_size}")
        if not 0 <= self.radius <= 8:
            raise ValueError(f"view radius must be 0..8 tiles, got {self.radius}")
        if not self.name or "/" in self.name:
            raise ValueError(f"game name must be non-empty without '/', got {self.name!r}")

    @property
    def width(self) -> int:
        """Cells across."""
        return self.cols * self.tile_size

    @property
    def height(self) -> int:
        """Cells down."""
        return self.rows * self.tile_size

    def tiles(self) -> list[Tile]:
        """Every tile, row by row."""
        return [Tile(c, r) for r in range(self.rows) for c in range(self.cols)]

    def clamp(self, x: float, y: float) -> tuple[float, float]:
        """``(x, y)`` moved onto the map (cells are ``[0, width) x [0, height)``)."""
        return min(max(x, 0.0), self.width - 1e-6), min(max(y, 0.0), self.height - 1e-6)

    def tile_of(self, x: float, y: float) -> Tile:
        """The tile holding the cell at ``(x, y)`` (clamped onto the map)."""
        cx, cy = self.clamp(x, y)
        return Tile(int(cx) // self.tile_size, int(cy) // self.tile_size)

    def index(self, tile: Tile) -> int:
        """A compact number for ``tile`` (row-major)."""
        return tile.row * self.cols + tile.col

    def tile_at(self, index: int) -> Tile:
        return Tile(index % self.cols, index // self.cols)

    def neighbourhood(self, tile: Tile) -> frozenset[Tile]:
        """The tiles within ``radius`` of ``tile`` (Chebyshev distance), clipped to the map."""
        r = self.radius
        return frozenset(
            Tile(c, w)
            for c in range(max(0, tile.col - r), min(self.cols, tile.col + r + 1))
            for w in range(max(0, tile.row - r), min(self.rows, tile.row + r + 1))
        )

    def topic(self, tile: Tile) -> str:
        """The topic of ``tile``: ``<name>/tile/<col>,<row>``."""
        return f"{self.name}/tile/{tile.col},{tile.row}"

    def bounds(self, tile: Tile) -> tuple[int, int, int, int]:
        """``(x0, y0, x1, y1)``: the cells of ``tile`` are ``x0 <= x < x1, y0 <= y < y1``."""
        s = self.tile_size
        return tile.col * s, tile.row * s, (tile.col + 1) * s, (tile.row + 1) * s

    def centre(self) -> Tile:
        """The default hot tile: the middle one (towards the top left on even maps)."""
        return Tile((self.cols - 1) // 2, (self.rows - 1) // 2)


def parse_tile(text: str) -> Tile:
    """``"COL,ROW"`` as a :class:`Tile` (``ValueError`` if malformed)."""
    col, sep, row = text.partition(",")
    if not sep or not col.strip().isdigit() or not row.strip().isdigit():
        raise ValueError(f"expected COL,ROW, got {text!r}")
    return Tile(int(col), int(row))


def parse_size(text: str) -> tuple[int, int]:
    """``"COLSxROWS"`` (e.g. ``4x4``) as a pair (``ValueError`` if malformed)."""
    cols, sep, rows = text.lower().partition("x")
    if not sep or not cols.isdigit() or not rows.isdigit():
        raise ValueError(f"expected COLSxROWS such as 4x4, got {text!r}")
    return int(cols), int(rows)


def interest_change(
    gmap: GameMap, joined: Iterable[Tile], here: Tile
) -> tuple[list[Tile], list[Tile]]:
    """What a player on ``here`` must join and leave, given the tiles it is joined to.

    Joins come first in the answer's use (see ``Player.reconcile``): a player
    never leaves the tile it stands on, because it is in its own neighbourhood.
    """
    want = gmap.neighbourhood(here)
    have = set(joined)
    return sorted(want - have), sorted(have - want)


# ------------------------------------------------------------ state updates

_UPDATE = struct.Struct("<QIHHQ8s")
UPDATE_SIZE = _UPDATE.size
"""Bytes of one encoded :class:`StateUpdate` (32)."""


@dataclass(frozen=True, slots=True)
class StateUpdate:
    """What a player publishes 20 times a second: who, which update, where, when.

    ``seq`` counts the player's updates over every tile (so a receiver keeps the
    newest); ``sent_ns`` is the sender's ``time.time_ns()`` just before publishing.
    """

    player: int
    seq: int
    x: int
    y: int
    sent_ns: int
    name: str = ""

    def encode(self) -> bytes:
        raw = self.name.encode()[:8]
        return _UPDATE.pack(self.player, self.seq, self.x, self.y, self.sent_ns, raw)

    @staticmethod
    def decode(data: bytes) -> StateUpdate | None:
        """``None`` for anything that is not an update (another app on the topic)."""
        if len(data) != UPDATE_SIZE:
            return None
        player, seq, x, y, sent, raw = _UPDATE.unpack(data)
        return StateUpdate(player, seq, x, y, sent, raw.rstrip(b"\0").decode(errors="replace"))


# -------------------------------------------------------------------- bots


@dataclass(frozen=True, slots=True)
class BotPlan:
    """Where bot ``index`` starts and what it does: wander the map or, with a
    ``home`` tile, walk there and stay (crowding)."""

    index: int
    name: str
    start: tuple[float, float]
    home: Tile | None
    seed: int


def plan_bots(
    gmap: GameMap, bots: int, crowd: int, seed: int, hot: Tile | None = None
) -> list[BotPlan]:
    """Deterministic plans: bots ``0..crowd-1`` crowd into ``hot``, the others wander.

    Crowders start outside ``hot`` (when the map has another tile) so they walk in.
    """
    if not 0 <= crowd <= bots:
        raise ValueError(f"crowd must be 0..bots ({bots}), got {crowd}")
    hot = hot if hot is not None else gmap.centre()
    if not (0 <= hot.col < gmap.cols and 0 <= hot.row < gmap.rows):
        raise ValueError(f"hot tile {hot} is outside the {gmap.cols}x{gmap.rows} map")
    rng = random.Random(seed)
    plans = []
    for i in range(bots):
        home = hot if i < crowd else None
        while True:
            start = (rng.uniform(0, gmap.width), rng.uniform(0, gmap.height))
            start = gmap.clamp(*start)
            if home is None or gmap.tile_of(*start) != home or len(gmap.tiles()) == 1:
                break
        plans.append(BotPlan(i, f"bot{i}", start, home, rng.randrange(1 << 32)))
    return plans


@dataclass(slots=True)
class Walker:
    """A bot's movement: straight at a target at ``speed`` cells/s, then a new target.

    A crowder's targets are all inside its home tile, so once there it stays.
    Invariant: the position is always on the map.
    """

    gmap: GameMap
    x: float
    y: float
    speed: float
    home: Tile | None
    rng: random.Random
    target: tuple[float, float] = (0.0, 0.0)

    @staticmethod
    def from_plan(gmap: GameMap, plan: BotPlan, speed: float) -> Walker:
        w = Walker(gmap, plan.start[0], plan.start[1], speed, plan.home, random.Random(plan.seed))
        w.target = w.pick_target()
        return w

    def pick_target(self) -> tuple[float, float]:
        if self.home is None:
            x0, y0, x1, y1 = 0, 0, self.gmap.width, self.gmap.height
        else:
            x0, y0, x1, y1 = self.gmap.bounds(self.home)
        return self.gmap.clamp(
            self.rng.uniform(x0 + 0.5, x1 - 0.5), self.rng.uniform(y0 + 0.5, y1 - 0.5)
        )

    def step(self, dt: float, allowed: Callable[[Tile], bool]) -> tuple[float, float]:
        """Move for ``dt`` seconds; a move onto a tile ``allowed`` refuses is not made."""
        tx, ty = self.target
        dx, dy = tx - self.x, ty - self.y
        dist = math.hypot(dx, dy)
        reach = self.speed * dt
        if dist <= reach:
            nx, ny = tx, ty
            self.target = self.pick_target()
        else:
            nx, ny = self.x + dx * reach / dist, self.y + dy * reach / dist
        nx, ny = self.gmap.clamp(nx, ny)
        if allowed(self.gmap.tile_of(nx, ny)):
            self.x, self.y = nx, ny
        return self.x, self.y


# ------------------------------------------------------------- world view


@dataclass(slots=True)
class WorldView:
    """What one player has seen of the others: the newest update of each.

    An update older than one already applied (it came on another tile, see
    ``cross_tile_stale`` in the report) is ignored, as a game would.
    """

    latest: dict[int, StateUpdate] = field(default_factory=dict)
    seen_at: dict[int, int] = field(default_factory=dict)
    latency_ns: dict[int, int] = field(default_factory=dict)

    def apply(self, update: StateUpdate, now_ns: int) -> bool:
        """Keep ``update`` if it is the player's newest; whether it was kept."""
        old = self.latest.get(update.player)
        if old is not None and old.seq >= update.seq:
            return False
        self.latest[update.player] = update
        self.seen_at[update.player] = now_ns
        self.latency_ns[update.player] = now_ns - update.sent_ns
        return True

    def visible(self, now_ns: int, ttl_ns: int = 2_000_000_000) -> list[StateUpdate]:
        """Players heard from within ``ttl_ns``, by name."""
        alive = [u for p, u in self.latest.items() if now_ns - self.seen_at[p] <= ttl_ns]
        return sorted(alive, key=lambda u: (u.name, u.player))


# ------------------------------------------------------------------ ledger


class Pub(NamedTuple):
    """One state update as published: by ``player`` on tile ``tile`` (index)."""

    player: int
    seq: int
    tile: int
    sent_ns: int


class Interval(NamedTuple):
    """One subscription of ``player`` to tile ``tile``.

    ``call_ns``: just before ``subscribe`` was called; ``acked_ns``: once it
    returned (the ACK wave is back), ``None`` if it never did; ``end_ns``:
    just before ``unsubscribe``, ``None`` if still subscribed at the end.
    """

    player: int
    tile: int
    call_ns: int
    acked_ns: int | None
    end_ns: int | None


class Receipt(NamedTuple):
    """Update ``seq`` of ``player``, sent at ``sent_ns``, delivered to ``subscriber``
    on ``tile`` after ``latency_us`` (receive wall clock minus ``sent_ns``)."""

    subscriber: int
    player: int
    seq: int
    tile: int
    sent_ns: int
    latency_us: int


class Sample(NamedTuple):
    """One second's mark of a shard: wall clock, its process's CPU time, and the
    whole host's busy and total CPU time (jiffies, 0 where unknown)."""

    t_ns: int
    cpu_s: float
    host_busy: int
    host_total: int


class ReceiptLog:
    """Receipts stored column-wise in arrays of machine integers, in arrival order.

    Compact, and invisible to the garbage collector: a long run's log never
    makes a collection (a pause in the game) longer.
    """

    __slots__ = ("_cols",)

    def __init__(self, receipts: Iterable[Receipt] = ()) -> None:
        self._cols = (array("Q"), array("Q"), array("q"), array("q"), array("q"), array("q"))
        for r in receipts:
            self.append(r)

    def append(self, r: Receipt) -> None:
        sub, player, seq, tile, sent, latency = self._cols
        sub.append(r.subscriber)
        player.append(r.player)
        seq.append(r.seq)
        tile.append(r.tile)
        sent.append(r.sent_ns)
        latency.append(r.latency_us)

    def extend(self, other: ReceiptLog) -> None:
        for mine, theirs in zip(self._cols, other._cols, strict=True):
            mine.extend(theirs)

    def __len__(self) -> int:
        return len(self._cols[0])

    def __iter__(self) -> Iterator[Receipt]:
        return map(Receipt._make, zip(*self._cols, strict=True))

    def to_json(self) -> list[list[int]]:
        return [col.tolist() for col in self._cols]

    @staticmethod
    def from_json(cols: list[list[int]]) -> ReceiptLog:
        log = ReceiptLog()
        for mine, values in zip(log._cols, cols, strict=True):
            mine.extend(values)
        return log


@dataclass(slots=True)
class Ledger:
    """Everything a run did, appended as it happens (per subscriber, receipts are
    in the order the application saw them).  JSON-able for worker processes."""

    names: dict[int, str] = field(default_factory=dict)
    pubs: list[Pub] = field(default_factory=list)
    intervals: list[Interval] = field(default_factory=list)
    receipts: ReceiptLog = field(default_factory=ReceiptLog)
    dropped: int = 0
    """Deliveries lost because a subscription was not read in time (library counter)."""
    stats: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    samples: list[list[Sample]] = field(default_factory=list)
    """Per shard (process), a :class:`Sample` every second of play."""
    foreign: int = 0
    """Payloads on a tile topic that were not state updates."""

    def to_json(self) -> dict[str, Any]:
        return {
            "names": {str(k): v for k, v in self.names.items()},
            "pubs": [list(p) for p in self.pubs],
            "intervals": [list(i) for i in self.intervals],
            "receipts": self.receipts.to_json(),
            "dropped": self.dropped,
            "stats": self.stats,
            "cpu_s": self.cpu_s,
            "foreign": self.foreign,
            "samples": [[list(x) for x in shard] for shard in self.samples],
        }

    @staticmethod
    def from_json(doc: dict[str, Any]) -> Ledger:
        return Ledger(
            names={int(k): str(v) for k, v in doc["names"].items()},
            pubs=[Pub(*p) for p in doc["pubs"]],
            intervals=[Interval(*i) for i in doc["intervals"]],
            receipts=ReceiptLog.from_json(doc["receipts"]),
            dropped=int(doc["dropped"]),
            stats={str(k): int(v) for k, v in doc["stats"].items()},
            cpu_s=float(doc["cpu_s"]),
            foreign=int(doc["foreign"]),
            samples=[[Sample(*x) for x in shard] for shard in doc.get("samples", [])],
        )

    @staticmethod
    def merge(parts: Iterable[Ledger]) -> Ledger:
        """One ledger from the shards' (each subscriber lives in exactly one shard)."""
        out = Ledger()
        for part in parts:
            out.names.update(part.names)
            out.pubs.extend(part.pubs)
            out.intervals.extend(part.intervals)
            out.receipts.extend(part.receipts)
            out.dropped += part.dropped
            for k, v in part.stats.items():
                out.stats[k] = out.stats.get(k, 0) + v
            out.cpu_s += part.cpu_s
            out.foreign += part.foreign
            out.samples.extend(part.samples)
        return out


# ------------------------------------------------------------------ checks


@dataclass(frozen=True, slots=True)
class OrderCheck:
    """Per-source FIFO as the application saw it.

    ``violations``: a (subscriber, player, tile) whose update numbers did not
    strictly increase (the library promises per-source FIFO per topic, so 0).
    ``cross_tile_stale``: an update older than one already received from the
    same player on another tile (possible right after the player changed tile:
    order is per topic; the game drops such updates).
    """

    ok: bool
    violations: int
    streams: int
    cross_tile_stale: int


def check_order(receipts: Iterable[Receipt]) -> OrderCheck:
    last: dict[tuple[int, int, int], int] = {}
    newest: dict[tuple[int, int], int] = {}
    violations = stale = 0
    for r in receipts:
        key = (r.subscriber, r.player, r.tile)
        prev = last.get(key)
        if prev is not None and r.seq <= prev:
            violations += 1
        last[key] = r.seq
        pair = (r.subscriber, r.player)
        top = newest.get(pair, -1)
        if r.seq < top:
            stale += 1
        else:
            newest[pair] = r.seq
    return OrderCheck(violations == 0, violations, len(last), stale)


@dataclass(frozen=True, slots=True)
class DeliveryCheck:
    """Receipts against what the subscriptions promise, with no timing assumption.

    A subscription delivers exactly the updates published after it was made
    (``call_ns``) and before it ended: ``expected_max`` counts them.  Of those,
    an update *must* have arrived when it was published once the subscription
    had returned (``acked_ns``) and either the subscription lasted to the end
    of the run (which waits until every round is acknowledged) or a later
    update of the same player on the same tile arrived in it (per-source FIFO
    then puts this one before it): ``expected_min`` counts them.
    ``missing``: a must-arrive update that did not; ``unexpected``: a receipt
    no subscription allows (or of an update never published); ``duplicates``:
    the same update delivered twice to one subscriber on one tile.
    """

    receipts: int
    expected_min: int
    expected_max: int
    missing: int
    unexpected: int
    duplicates: int

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.duplicates)


def check_deliveries(ledger: Ledger) -> DeliveryCheck:
    """Compare ``ledger.receipts`` with its publications and subscription intervals."""
    sent = {(p.player, p.seq): p for p in ledger.pubs}
    by_tile: dict[int, list[Pub]] = defaultdict(list)
    for p in sorted(ledger.pubs, key=lambda p: p.sent_ns):
        by_tile[p.tile].append(p)
    times = {t: [p.sent_ns for p in pubs] for t, pubs in by_tile.items()}
    windows: dict[tuple[int, int], list[Interval]] = defaultdict(list)
    for iv in ledger.intervals:
        windows[(iv.player, iv.tile)].append(iv)
    got: set[tuple[int, int, int, int]] = set()
    newest: dict[tuple[int, int, int, int], int] = {}
    duplicates = unexpected = 0
    for r in ledger.receipts:
        key = (r.subscriber, r.tile, r.player, r.seq)
        duplicates += key in got
        got.add(key)
        pub = sent.get((r.player, r.seq))
        spot = None
        if pub is not None and pub.tile == r.tile and pub.player != r.subscriber:
            spot = _interval_of(windows.get((r.subscriber, r.tile), []), pub.sent_ns)
        if spot is None:
            unexpected += 1
            continue
        stream = (r.subscriber, r.tile, spot, r.player)
        newest[stream] = max(newest.get(stream, -1), r.seq)
    lo = hi = missing = 0
    for (sub, tile), ivs in windows.items():
        pubs, ts = by_tile.get(tile, []), times.get(tile, [])
        for n, iv in enumerate(ivs):
            stop = len(ts) if iv.end_ns is None else bisect.bisect_right(ts, iv.end_ns)
            for p in pubs[bisect.bisect_left(ts, iv.call_ns) : stop]:
                if p.player == sub:
                    continue
                hi += 1
                must = (
                    iv.acked_ns is not None
                    and p.sent_ns >= iv.acked_ns
                    and (iv.end_ns is None or p.seq < newest.get((sub, tile, n, p.player), -1))
                )
                lo += must
                missing += must and (sub, tile, p.player, p.seq) not in got
    return DeliveryCheck(len(ledger.receipts), lo, hi, missing, unexpected, duplicates)


def _interval_of(ivs: list[Interval], t: int) -> int | None:
    """Index of the interval of ``ivs`` that holds time ``t`` (they never overlap)."""
    for n, iv in enumerate(ivs):
        if iv.call_ns <= t and (iv.end_ns is None or t <= iv.end_ns):
            return n
    return None


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

"""The run's ledger and the checks on it.  The :class:`Ledger` holds everything
a run did: every update published, every subscription interval, every receipt,
the library's counters and the CPU samples, appended as they happen and
JSON-able for worker processes.  :func:`check_order` (per-source FIFO) and
:func:`check_deliveries` (receipts against what the subscriptions promise)
judge it.  Nothing here touches a socket, a clock or trio (the caller supplies
every timestamp), so all of it is tested headless (``tests/test_game.py``).
Tiles are recorded by index (``GameMap.index``), so this module needs no map.

Invariant: the ledger only records, in order; it never judges or drops
anything.  Per subscriber, receipts stay in the order the application saw
them (the order check relies on it), also when shards' ledgers are merged,
since each subscriber lives in exactly one shard.
"""

from __future__ import annotations

import bisect
from array import array
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

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

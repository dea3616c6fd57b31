"""On the device: counters and histograms per window, spooled to rotated, capped CBOR files.

Cheap enough to leave on: recording a delivery is a dict lookup, two
additions and a bisection (in C) over 40 histogram edges, about 0.3 µs;
records are built once per window (default 10 s).  Nothing here touches the
network.  The cost measured on real nodes is in ``docs/telemetry.md``
("Cost of recording").

Spool directory layout::

    SPOOL/boot                                   boot counter (incarnation), one line
    SPOOL/<boot 8>-<first seq 12>-<last seq 12>.cbor   complete files, oldest first by name
    SPOOL/<boot 8>-<first seq 12>.part           the file being written

Invariants: a record is written whole or not at all (a crash mid-write leaves
a truncated last item, which the job quarantines); complete files never
change; the total size of complete files stays under ``max_bytes`` by deleting
the oldest first, and every record so deleted is counted in ``dropped`` and
reported in a ``spool_dropped`` event record.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from p2p.telemetry._schema import (
    EDGES,
    HISTOGRAMS,
    SCHEMA_VERSION,
    TelemetryError,
    empty_histogram,
    encode_record,
    iter_items,
    record_id,
)

_STAT_KEYS = {
    "packets_sent": "packets_sent",
    "packets_received": "packets_received",
    "frames_sent": "frames_sent",
    "frames_received": "frames_received",
    "bytes_sent": "bytes_sent",
    "bytes_received": "bytes_received",
    "rejected": "rejected_connections",
}
_DROP_KEYS = ("outbox_overflow", "oversize_dropped", "lost_on_disconnect", "undeliverable")


def _name(boot: int, first: int, last: int | None = None) -> str:
    return f"{boot:08d}-{first:012d}" + (".part" if last is None else f"-{last:012d}.cbor")


def _count(path: Path) -> int:
    """Records in a complete spool file (from its name)."""
    _, first, last = path.stem.split("-")
    return int(last) - int(first) + 1


class Spool:
    """Append-only record files: rotated at ``file_bytes``, capped at ``max_bytes`` in total."""

    def __init__(
        self, directory: str | Path, *, max_bytes: int = 64 << 20, file_bytes: int = 256 << 10
    ) -> None:
        if not 0 < file_bytes <= max_bytes:
            raise TelemetryError("spool: need 0 < file_bytes <= max_bytes")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.file_bytes = file_bytes
        self.dropped = 0
        """Records deleted to keep the disk cap (oldest first)."""
        self._finish_leftovers()
        self.boot = self._next_boot()
        self._fh: Any = None
        self._first = 0
        self._last = -1
        self._size = 0

    def _next_boot(self) -> int:
        path = self.dir / "boot"
        try:
            boot = int(path.read_text().strip()) + 1
        except (OSError, ValueError):
            boot = 0
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{boot}\n")
        os.replace(tmp, path)
        return boot

    def _finish_leftovers(self) -> None:
        """A ``.part`` left by a crash becomes a complete file named by the records it holds."""
        for part in sorted(self.dir.glob("*.part")):
            boot, first = (int(x) for x in part.stem.split("-"))
            items = [item for item, err in iter_items(part.read_bytes()) if err is None]
            if not items:
                part.unlink()
                continue
            os.replace(part, self.dir / _name(boot, first, first + len(items) - 1))

    def write(self, seq: int, data: bytes) -> None:
        """Append one encoded record (``seq`` is its number in this boot)."""
        if self._fh is None:
            self._first, self._size = seq, 0
            self._fh = open(self.dir / _name(self.boot, seq), "ab")  # noqa: SIM115
        self._fh.write(data)
        self._fh.flush()
        self._last = seq
        self._size += len(data)
        if self._size >= self.file_bytes:
            self.rotate()

    def rotate(self) -> Path | None:
        """Complete the current file (if any); returns it.  Then enforce the disk cap."""
        if self._fh is None:
            return None
        self._fh.close()
        self._fh = None
        done = self.dir / _name(self.boot, self._first, self._last)
        os.replace(self.dir / _name(self.boot, self._first), done)
        self._enforce_cap()
        return done

    def complete(self) -> list[Path]:
        """Complete files, oldest first (what an uploader sends)."""
        return sorted(self.dir.glob("*.cbor"))

    def _enforce_cap(self) -> None:
        files = self.complete()
        total = sum(f.stat().st_size for f in files)
        while files and total > self.max_bytes:
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            self.dropped += _count(oldest)
            oldest.unlink()

    def close(self) -> None:
        self.rotate()


class _TopicWindow:
    """One topic's counters and histograms (``HISTOGRAMS``) in the current window."""

    __slots__ = ("ack_round", "deliveries", "held", "holdback", "latency", "publications")

    def __init__(self) -> None:
        self.publications = 0
        self.deliveries = 0
        self.held = 0
        self.latency = empty_histogram()
        self.holdback = empty_histogram()
        self.ack_round = empty_histogram()


class Recorder:
    """Counters and histograms of one node, turned into records once per window.

    ``device`` is the node id; records get ids ``<device>-<boot>-<seq>`` with
    the spool's boot counter, so a restarted device never reuses an id.
    """

    def __init__(self, device: int, spool: Spool, *, window: float = 10.0) -> None:
        if window <= 0:
            raise TelemetryError("telemetry window must be positive")
        self.device = f"{device:016x}"
        self.spool = spool
        self.window = window
        self.seq = 0
        self._topics: dict[str, _TopicWindow] = {}
        self._last_stats: dict[str, int] = {}
        self._last_cpu = time.process_time()
        self._reported_drops = 0
        self.closed = False
        """Set once the node has written its ``stop`` event."""

    # ---------------------------------------------------------- recording

    # The node calls these for every publication, delivery and acknowledgement:
    # one dict lookup each, the window created on a topic's first use.

    def _new(self, topic: str) -> _TopicWindow:
        tw = self._topics[topic] = _TopicWindow()
        return tw

    def published(self, topic: str) -> None:
        tw = self._topics.get(topic) or self._new(topic)
        tw.publications += 1

    def delivered(self, topic: str, latency_ms: float | None, holdback_ms: float) -> None:
        """A delivery of another node's publication (``latency_ms`` from its publish time)."""
        tw = self._topics.get(topic) or self._new(topic)
        tw.deliveries += 1
        if latency_ms is not None:
            tw.latency[bisect_right(EDGES, latency_ms)] += 1  # bucket(), inlined: hot path
        if holdback_ms > 0:
            tw.held += 1
            tw.holdback[bisect_right(EDGES, holdback_ms)] += 1

    def acked_since(self, topic: str, now: float, sent: list[float | None]) -> None:
        """A round's ACK wave came back at ``now`` (seconds, the node's clock) for
        publications sent at ``sent``: one ``ack_round`` count each (``None``: not
        timed, not counted), so ``sum(ack_round)`` stays the publications acked."""
        hist = (self._topics.get(topic) or self._new(topic)).ack_round
        for t in sent:
            if t is not None:
                hist[bisect_right(EDGES, (now - t) * 1000)] += 1

    def event(
        self, now: float, name: str, peer: int | None = None, detail: str | None = None
    ) -> None:
        fields: dict[str, Any] = {"event": name}
        if peer is not None:
            fields["peer"] = f"{peer:016x}"
        if detail is not None:
            fields["detail"] = detail[:256]
        self._emit(now, 0.0, "event", fields)

    # ------------------------------------------------------------ windows

    def flush(self, now: float, stats: Mapping[str, int], connections: int) -> None:
        """Write this window's node record and one record per active topic."""
        delta = {k: stats.get(k, 0) - self._last_stats.get(k, 0) for k in stats}
        self._last_stats = dict(stats)
        cpu = time.process_time()
        node: dict[str, Any] = {k: max(0, delta.get(v, 0)) for k, v in _STAT_KEYS.items()}
        node.update(
            rss_bytes=_rss_bytes(),
            cpu_s=round(cpu - self._last_cpu, 6),
            connections=connections,
            suspicions=0,
            repairs=0,
            dropped=max(0, sum(delta.get(k, 0) for k in _DROP_KEYS)),
        )
        self._last_cpu = cpu
        self._emit(now, self.window, "node", node)
        for topic, tw in sorted(self._topics.items()):
            fields: dict[str, Any] = {
                "topic": topic,
                "publications": tw.publications,
                "deliveries": tw.deliveries,
                "held": tw.held,
                **{h: getattr(tw, h) for h in HISTOGRAMS},
            }
            self._emit(now, self.window, "topic", fields)
        self._topics.clear()
        if self.spool.dropped > self._reported_drops:
            lost = self.spool.dropped - self._reported_drops
            self._reported_drops = self.spool.dropped
            self.event(now, "spool_dropped", detail=f"{lost} records")

    def _emit(self, now: float, window: float, kind: str, fields: dict[str, Any]) -> None:
        boot = self.spool.boot
        rec = {
            "v": SCHEMA_VERSION,
            "id": record_id(self.device, boot, self.seq),
            "device": self.device,
            "boot": boot,
            "seq": self.seq,
            "t": now,
            "window": window,
            "kind": kind,
            **fields,
        }
        self.spool.write(self.seq, encode_record(rec))
        self.seq += 1


def _rss_bytes() -> int:
    """Resident set size of this process (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


__all__ = ["Recorder", "Spool"]

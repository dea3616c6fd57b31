"""Telemetry records: the versioned schema shared by devices, the collector and the Spark job.

A *spool file* is a sequence of CBOR data items (RFC 8949), one record each,
written one after the other (no framing: a CBOR item delimits itself).  A
record is a CBOR map with text keys:

=========  ============  ========================================================
key        type          meaning
=========  ============  ========================================================
``v``      int           schema version, :data:`SCHEMA_VERSION` (1)
``id``     text          unique record id ``<device>-<boot>-<seq>`` (dedup key)
``device`` text          16 lowercase hex digits: the node's 64-bit overlay id
``boot``   int           the device's boot counter (incarnation), >= 0
``seq``    int           record number within the boot, >= 0, increasing
``t``      float         end of the window, Unix seconds
``window`` float         window length in seconds (> 0, <= 86400); 0 for ``event``
``kind``   text          ``node``, ``topic`` or ``event`` (fields below)
=========  ============  ========================================================

``node`` (one per device per window):
    ``rss_bytes`` int, ``cpu_s`` float (CPU seconds used in the window),
    ``connections`` int (open), ``packets_sent``, ``packets_received``,
    ``frames_sent``, ``frames_received``, ``bytes_sent``, ``bytes_received``,
    ``suspicions``, ``repairs``, ``rejected`` (connections closed for bad input),
    ``dropped`` (packets lost: overflow, disconnect) — all ints >= 0.

``topic`` (one per device per topic with activity in the window):
    ``topic`` text, ``publications``, ``deliveries``, ``held`` (deliveries that
    waited in the causal hold-back buffer) ints >= 0, and three histograms:
    ``latency`` (publish to delivery, ms), ``holdback`` (time held back, ms),
    ``ack_round`` (publish to the ACK wave's return, ms).

``event`` (a point in time, ``window`` 0):
    ``event`` text, one of :data:`EVENTS`; ``peer`` text (16 hex digits) or
    absent; ``detail`` text (<= 256 chars) or absent.

A *histogram* is a list of :data:`BUCKETS` + 1 ints >= 0: ``h[i]`` counts
values ``v`` with ``EDGES[i-1] <= v < EDGES[i]`` (for ``i = 0`` the lower
bound is 0; the last bucket is open-ended).  Edges are fixed and shared by every device, so
histograms merge by adding them element-wise, and percentiles of a merged
histogram are :func:`percentile` of it.

:func:`validate` is the one check: it returns the record or raises
:class:`TelemetryError` naming the problem.  Unknown extra keys are rejected
(a typo must not pass silently); a newer ``v`` is rejected with its number.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import cbor2

from p2p._errors import P2PError
from p2p._stats import nearest_rank

SCHEMA_VERSION: Final = 1

EDGES: Final[tuple[float, ...]] = tuple(round(0.1 * 2 ** (k / 2), 6) for k in range(40))
"""Upper bucket edges in milliseconds: 0.1 ms times powers of sqrt(2), up to ~74 s."""

BUCKETS: Final = len(EDGES)
"""Histograms have ``BUCKETS + 1`` counts (the last one is open-ended)."""

KINDS: Final = ("node", "topic", "event")
EVENTS: Final = (
    "start",
    "stop",
    "crash",
    "suspect",
    "unsuspect",
    "repair",
    "join",
    "leave",
    "spool_dropped",
)
"""``spool_dropped``: the device's spool hit its disk cap; ``detail`` is ``"<n> records"``."""

NODE_COUNTERS: Final = (
    "rss_bytes",
    "connections",
    "packets_sent",
    "packets_received",
    "frames_sent",
    "frames_received",
    "bytes_sent",
    "bytes_received",
    "suspicions",
    "repairs",
    "rejected",
    "dropped",
)
TOPIC_COUNTERS: Final = ("publications", "deliveries", "held")
HISTOGRAMS: Final = ("latency", "holdback", "ack_round")

MAX_RECORD_BYTES: Final = 16 * 1024
"""Largest encoded record accepted."""

MAX_TOPIC_LEN: Final = 256
MAX_TIME: Final = 253402300799
"""9999-12-31T23:59:59Z: the last instant a timestamp column can hold."""
_HEX16 = re.compile(r"[0-9a-f]{16}")
_BASE = ("v", "id", "device", "boot", "seq", "t", "window", "kind")
_INT_LIMIT = 1 << 63


class TelemetryError(P2PError):
    """A telemetry record, spool file or landing directory breaks the schema."""


def record_id(device: str, boot: int, seq: int) -> str:
    """The dedup key of a record."""
    return f"{device}-{boot}-{seq}"


def bucket(value_ms: float) -> int:
    """Index of the histogram bucket holding ``value_ms``: that of the first edge strictly
    greater than it (negative values go to 0, NaN to the open last bucket).

    ``bisect`` in C: a device buckets every delivery and acknowledgement (the
    recorder makes the same call inline).
    """
    return bisect_right(EDGES, value_ms)


def empty_histogram() -> list[int]:
    return [0] * (BUCKETS + 1)


def percentile(hist: Sequence[int], q: float) -> float | None:
    """The ``q``-quantile (0..1) of a histogram, as its bucket's upper edge (ms).

    ``None`` for an empty histogram; the open last bucket reports its lower edge.
    """
    total = sum(hist)
    if total == 0:
        return None
    rank = nearest_rank(total, q * 100)
    seen = 0
    for i, count in enumerate(hist):
        seen += count
        if seen >= rank:
            return EDGES[i] if i < BUCKETS else EDGES[-1]
    return EDGES[-1]


# ---------------------------------------------------------------- validation


def _int(rec: Mapping[str, Any], key: str) -> int:
    v = rec.get(key)
    if type(v) is not int or not 0 <= v < _INT_LIMIT:
        raise TelemetryError(f"{key}: expected an int >= 0, got {v!r}"[:200])
    return v


def _num(rec: Mapping[str, Any], key: str) -> float:
    v = rec.get(key)
    if not (type(v) is int or type(v) is float) or not math.isfinite(v):
        raise TelemetryError(f"{key}: expected a finite number, got {v!r}"[:200])
    return float(v)


def _hist(rec: Mapping[str, Any], key: str) -> None:
    v = rec.get(key)
    if type(v) is not list or len(v) != BUCKETS + 1:
        raise TelemetryError(f"{key}: expected a histogram of {BUCKETS + 1} counts")
    if any(type(c) is not int or not 0 <= c < _INT_LIMIT for c in v):
        raise TelemetryError(f"{key}: histogram counts must be ints >= 0")


def _device(v: object, key: str) -> str:
    if type(v) is not str or not _HEX16.fullmatch(v):
        raise TelemetryError(f"{key}: expected 16 lowercase hex digits, got {v!r}"[:200])
    return v


def validate(rec: object) -> dict[str, Any]:
    """``rec`` if it is a valid record of this schema version, else :class:`TelemetryError`."""
    if not isinstance(rec, dict) or not all(type(k) is str for k in rec):
        raise TelemetryError("record: expected a map with text keys")
    version = rec.get("v")
    if version != SCHEMA_VERSION or type(version) is not int:
        raise TelemetryError(f"v: unsupported schema version {version!r}"[:200])
    device = _device(rec.get("device"), "device")
    boot, seq = _int(rec, "boot"), _int(rec, "seq")
    if rec.get("id") != record_id(device, boot, seq):
        raise TelemetryError("id: must be <device>-<boot>-<seq>")
    if not 0 < _num(rec, "t") <= MAX_TIME:
        raise TelemetryError("t: must be positive and before year 10000")
    window = _num(rec, "window")
    kind = rec.get("kind")
    if kind not in KINDS:
        raise TelemetryError(f"kind: expected one of {KINDS}, got {kind!r}"[:200])
    if (kind == "event") != (window == 0) or not 0 <= window <= 86400:
        raise TelemetryError("window: 0 for events, in (0, 86400] otherwise")
    allowed = set(_BASE) | _check_kind(rec, str(kind))
    extra = set(rec) - allowed
    if extra:
        raise TelemetryError(f"unknown keys {sorted(extra)[:5]}")
    return rec


def _check_kind(rec: Mapping[str, Any], kind: str) -> set[str]:
    """Check the kind's fields; return the keys it allows."""
    if kind == "node":
        for key in NODE_COUNTERS:
            _int(rec, key)
        _num(rec, "cpu_s")
        return {*NODE_COUNTERS, "cpu_s"}
    if kind == "topic":
        topic = rec.get("topic")
        if type(topic) is not str or not 0 < len(topic.encode()) <= MAX_TOPIC_LEN:
            raise TelemetryError("topic: expected 1..256 bytes of text")
        for key in TOPIC_COUNTERS:
            _int(rec, key)
        for key in HISTOGRAMS:
            _hist(rec, key)
        return {"topic", *TOPIC_COUNTERS, *HISTOGRAMS}
    if rec.get("event") not in EVENTS:
        raise TelemetryError(f"event: expected one of {EVENTS}")
    if "peer" in rec:
        _device(rec["peer"], "peer")
    detail = rec.get("detail", "")
    if type(detail) is not str or len(detail) > 256:
        raise TelemetryError("detail: expected text of at most 256 characters")
    return {"event", "peer", "detail"}


# ------------------------------------------------------------------- files


def encode_record(rec: Mapping[str, Any]) -> bytes:
    """One record as CBOR (validated first: a device never writes what the job rejects)."""
    validate(dict(rec))
    data = cbor2.dumps(dict(rec))
    if len(data) > MAX_RECORD_BYTES:
        raise TelemetryError(f"record of {len(data)} bytes exceeds {MAX_RECORD_BYTES}")
    return data


def iter_items(data: bytes) -> Iterator[tuple[object | None, str | None]]:
    """The CBOR items of a spool file's bytes: ``(item, None)`` or ``(None, error)``.

    A corrupt item ends the file (CBOR cannot resynchronise): the error is
    reported once and iteration stops, so what came before is kept.
    """
    import io

    stream = io.BytesIO(data)
    decoder = cbor2.CBORDecoder(stream)
    while stream.tell() < len(data):
        start = stream.tell()
        try:
            item = decoder.decode()
        except (cbor2.CBORDecodeError, ValueError, EOFError, RecursionError) as exc:
            yield None, f"undecodable CBOR at byte {start}: {exc}"[:300]
            return
        if stream.tell() - start > MAX_RECORD_BYTES:
            yield None, f"record at byte {start} exceeds {MAX_RECORD_BYTES} bytes"
            continue
        yield item, None


__all__ = [
    "BUCKETS",
    "EDGES",
    "EVENTS",
    "HISTOGRAMS",
    "KINDS",
    "MAX_RECORD_BYTES",
    "NODE_COUNTERS",
    "SCHEMA_VERSION",
    "TOPIC_COUNTERS",
    "TelemetryError",
    "bucket",
    "empty_histogram",
    "encode_record",
    "iter_items",
    "percentile",
    "record_id",
    "validate",
]

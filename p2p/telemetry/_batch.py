"""Validating a spool file's items in one batch: the job's fast record path.

:func:`~p2p.telemetry.validate` checks a topic record's 3 x 41 histogram
counts one by one in Python, which was most of the job's cost.  Here each
item first gets a quick check of its scalar fields (a *sufficient*
condition: everything it accepts, ``validate`` accepts), and the
histograms of all the file's topic records that passed it are checked at
once with numpy.  Every item the quick path does not accept goes through
``validate`` itself, so verdicts and error messages are exactly
``validate``'s; the quick path only decides faster.

Why the histogram check is exact: the quick check saw three lists of 41
items; ``array('q', ...)`` packs their items only if every one is a Python
int (or bool) that fits int64 (a float, text, null, list or CBOR simple
value raises), and numpy's minimum of the packed counts is >= 0 only if
none is negative.  Bools
are ruled out by the record's bytes: CBOR encodes them as the bytes
``0xf4``/``0xf5``, so a record whose encoding holds neither byte has no
bool anywhere (one that does takes the ``validate`` path, a few percent).
Batches whose largest count is 2**32 or more also take that path, so the
int64 sums the job does with the accepted arrays cannot overflow.

Without numpy (an executor that lacks it) every item takes ``validate``:
slower, same results.
"""

from __future__ import annotations

import re
from array import array
from typing import Any, Final

from p2p.telemetry._schema import (
    BUCKETS,
    HISTOGRAMS,
    MAX_TIME,
    MAX_TOPIC_LEN,
    NODE_COUNTERS,
    TOPIC_COUNTERS,
    validate,
)

try:
    import numpy as np
except ImportError:  # pragma: no cover - exercised on executors without numpy
    np = None  # type: ignore[assignment]

_BASE: Final = ("v", "id", "device", "boot", "seq", "t", "window", "kind")
_NODE_KEYS: Final = frozenset((*_BASE, *NODE_COUNTERS, "cpu_s"))
_TOPIC_KEYS: Final = frozenset((*_BASE, "topic", *TOPIC_COUNTERS, *HISTOGRAMS))
_HEX16: Final = re.compile(r"[0-9a-f]{16}")
_INT_LIMIT: Final = 1 << 63
_SUM_LIMIT: Final = 1 << 32
_NH: Final = len(HISTOGRAMS)
_LATENCY, _HOLDBACK, _ACK_ROUND = HISTOGRAMS
CHUNK: Final = 256
"""Topic records whose histograms are checked together: one odd count sends only its
chunk to ``validate``."""

VALID, HISTS, SLOW = 1, 2, 0
"""Quick verdicts: valid; valid if its histograms are; unknown (ask ``validate``)."""


class Checker:
    """Quick checks with the device and topic strings already found valid (per task)."""

    __slots__ = ("devices", "topics")

    def __init__(self) -> None:
        self.devices: set[str] = set()
        self.topics: set[str] = set()

    def _device(self, device: object) -> bool:
        if device in self.devices:
            return True
        if type(device) is not str or not _HEX16.fullmatch(device):
            return False
        self.devices.add(device)
        return True

    def _topic(self, topic: object) -> bool:
        if topic in self.topics:
            return True
        if type(topic) is not str:
            return False
        try:
            size = len(topic.encode())
        except UnicodeError:  # validate raises it: its message goes to the quarantine
            return False
        if not 0 < size <= MAX_TOPIC_LEN:
            return False
        self.topics.add(topic)
        return True

    def quick(self, rec: object) -> int:
        """:data:`VALID`, :data:`HISTS` or :data:`SLOW` for one decoded item."""
        if type(rec) is not dict:
            return SLOW
        kind = rec.get("kind")
        keys = rec.keys()
        if not ((kind == "topic" and keys == _TOPIC_KEYS) or
                (kind == "node" and keys == _NODE_KEYS)):  # fmt: skip
            return SLOW  # events (optional keys) and anything odd: validate
        v, device, boot, seq = rec["v"], rec["device"], rec["boot"], rec["seq"]
        t, window = rec["t"], rec["window"]
        if not (
            type(v) is int
            and v == 1
            and self._device(device)
            and type(boot) is int
            and type(seq) is int
            and 0 <= boot < _INT_LIMIT
            and 0 <= seq < _INT_LIMIT
            and rec["id"] == f"{device}-{boot}-{seq}"
            and type(t) is float
            and 0 < t <= MAX_TIME
            and type(window) is float
            and 0 < window <= 86400
        ):
            return SLOW
        if kind == "node":
            cpu = rec["cpu_s"]
            if type(cpu) is not float or cpu - cpu != 0.0:  # not finite
                return SLOW
            return VALID if _counts_ok(rec, NODE_COUNTERS) else SLOW
        if not (self._topic(rec["topic"]) and _counts_ok(rec, TOPIC_COUNTERS)):
            return SLOW
        for key in HISTOGRAMS:
            h = rec[key]
            if type(h) is not list or len(h) != BUCKETS + 1:
                return SLOW
        return HISTS


def _counts_ok(rec: dict[str, Any], keys: tuple[str, ...]) -> bool:
    for key in keys:
        c = rec[key]
        if type(c) is not int or not 0 <= c < _INT_LIMIT:
            return False
    return True


def _hist_batch(recs: list[Any]) -> Any:
    """The (n, 3, 41) int64 array of these records' histograms, or ``None`` if any count
    is not an int in [0, 2**32) (then each record takes ``validate``).

    ``array('q', ...)`` packs the counts in one C loop and refuses anything but an
    int (or bool) that fits int64; numpy then checks the range on the packed buffer.
    """
    if np is None or not recs:
        return None
    flat: list[Any] = []
    for r in recs:  # each histogram is a list of BUCKETS + 1 items (quick checked it)
        flat += r[_LATENCY]
        flat += r[_HOLDBACK]
        flat += r[_ACK_ROUND]
    try:
        packed = array("q", flat)
    except (TypeError, OverflowError):
        return None
    arr = np.frombuffer(packed, dtype=np.int64).reshape(len(recs), _NH, BUCKETS + 1)
    if arr.min() < 0 or arr.max() >= _SUM_LIMIT:
        return None
    return arr


def check_file(
    checker: Checker,
    blob: bytes,
    items: list[tuple[int, int, object, str | None]],
    batch: bool = True,
) -> tuple[list[Any], Any, dict[int, int]]:
    """Verdicts for a file's scanned items ``(start, end, item, error)``.

    Returns ``(verdicts, hists, rows)``: ``verdicts[i]`` is the valid record,
    or the exception ``validate`` raised for it, or ``None`` for an item
    that did not decode; ``hists`` the int64 histogram array of the topic
    records accepted in batch (``None`` if none) and ``rows`` maps an item's
    index to its row there.  ``batch=False``: every item takes ``validate``.
    """
    verdicts: list[Any] = [None] * len(items)
    quick = checker.quick
    waiting: list[int] = []
    for i, (start, end, item, error) in enumerate(items):
        if error is not None:
            continue
        q = quick(item) if batch and np is not None else SLOW
        if q == VALID:
            verdicts[i] = item
        elif q == HISTS and b"\xf4" not in blob[start:end] and b"\xf5" not in blob[start:end]:
            waiting.append(i)
        else:
            verdicts[i] = _validated(item)
    arrays: list[Any] = []
    rows: dict[int, int] = {}
    for lo in range(0, len(waiting), CHUNK):
        chunk = waiting[lo : lo + CHUNK]
        arr = _hist_batch([items[i][2] for i in chunk])
        if arr is None:  # some count is odd: each record of this chunk takes validate
            for i in chunk:
                verdicts[i] = _validated(items[i][2])
            continue
        base = sum(len(a) for a in arrays)
        arrays.append(arr)
        for row, i in enumerate(chunk):
            verdicts[i] = items[i][2]
            rows[i] = base + row
    hists = None if not arrays else arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
    return verdicts, hists, rows


def _validated(item: object) -> Any:
    """``validate(item)``, or the exception it raised (any: the item is quarantined)."""
    try:
        return validate(item)
    except Exception as exc:
        return exc


__all__ = ["Checker", "check_file"]

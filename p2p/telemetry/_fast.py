"""The compiled record path: node and topic records read straight from a spool file's bytes.

cbor2 builds a Python dict (and 123 list items) per topic record, and the
checks and folds that follow are Python too: about 15 CPU-µs per record on
an idle core, twice a plain decode-and-sum.  Here one compiled function
(numba, the ``spark`` extra) walks the bytes of a run of records and
writes their fields into arrays, with a 64-bit digest of each record's
bytes (for the dedupe) and its topic's code in a per-task table; the task
folds those arrays with numpy (about 0.6 µs a record here, 2 to 3 µs with
the fold).

The invariant, by construction: the parser *accepts* an item only if
cbor2 would decode it to a map that :func:`~p2p.telemetry.validate`
accepts, whose ``device`` is the folder's, and whose values are exactly
the ones written to the arrays.  It accepts only this subset of CBOR:

* a definite-length map of at most 23 pairs, every key one of the schema's
  text keys (at most 23 bytes), none twice, and exactly the key set of a
  ``node`` or a ``topic`` record (events take the other path);
* ``v`` the int 1; ``boot``, ``seq`` and ``node`` counters unsigned ints
  below 2**63 (no bools, floats, tags or negative ints); topic counters and
  histogram counts below 2**32, so that int64 sums of up to 2**31 of them
  are exact; histograms definite arrays of exactly 41 such ints;
* ``t``, ``window``, ``cpu_s`` 64-bit floats (``0xfb``) with
  ``0 < t <= MAX_TIME``, ``0 < window <= 86400`` and a finite ``cpu_s``;
* ``device`` the folder's 16 hex digits, ``id`` exactly
  ``<device>-<boot>-<seq>``, ``kind`` ``node`` or ``topic``, ``topic``
  1..256 bytes of ASCII (so valid UTF-8 and 1..256 bytes encoded);
* the whole item at most ``MAX_RECORD_BYTES``.

Anything else (an event, an int time, a half float, a count of 2**32, a
torn tail, a record of another device...) stops the run: the task decodes
that one item with cbor2 and gives it to the exact path, then resumes
here.  So verdicts, messages and quarantine rows are the other paths';
this one only decides faster.

The parser is :mod:`p2p.telemetry._kernel`; this module wraps it and is
importable without numba (then :func:`available` is false and the task
uses the other paths).
"""

from __future__ import annotations

import importlib
from typing import Any

from p2p.telemetry._columns import (
    BOOT,
    CODE,
    COUNTERS,
    CPU,
    DIGEST,
    END,
    INT_COLS,
    KEYS,
    KIND,
    NODE,
    RUN,
    SEQ,
    START,
    TOPIC,
    TOPIC_LEN,
    TOPIC_OFF,
    TOPICS,
    WINDOW,
    T,
)
from p2p.telemetry._schema import (
    BUCKETS,
    HISTOGRAMS,
    MAX_TOPIC_LEN,
)

_KERNEL: Any = None
_TRIED = False


def _kernel() -> Any:
    """:mod:`p2p.telemetry._kernel`, imported and compiled once, or ``None`` without numpy
    or numba, or if this numba cannot compile it (then the exact path does the work)."""
    global _KERNEL, _TRIED
    if not _TRIED:
        _TRIED = True
        try:
            kernel = importlib.import_module("p2p.telemetry._kernel")
            _KERNEL = kernel
            Parser().run(_bytes(b"\xa0"), 0, "0" * 16)  # compiles (or loads) the parser
            kernel.digest(_bytes(b"\xa0"), 0, 1)
        except ImportError:
            _KERNEL = None
        except Exception:  # a numba that cannot compile it: the exact path, same tables
            _KERNEL = None
    return _KERNEL


def _bytes(data: bytes) -> Any:
    import numpy as np

    return np.frombuffer(data, dtype=np.uint8)


def available() -> bool:
    """Whether the compiled path can run here (numpy and numba importable)."""
    return _kernel() is not None


class Parser:
    """One task's reusable arrays, and the key table, for :meth:`run`.

    After ``count, stop = parser.run(...)``, rows ``[:count]`` of ``ints``
    (columns ``_kernel.START`` ... ``COUNTERS``), ``floats`` (``T``,
    ``WINDOW``, ``CPU``) and ``hists`` (``(count, 3, 41)``) are the accepted
    records, in file order.
    """

    __slots__ = ("dev", "device", "floats", "hists", "ints", "k", "keys", "lens", "names", "sizes",
                 "slots", "table")  # fmt: skip

    def __init__(self) -> None:
        import numpy as np

        self.k = _kernel()
        table = [key.encode() for key in KEYS]
        self.keys = np.zeros((len(table), 24), dtype=np.uint8)
        for i, key in enumerate(table):
            self.keys[i, : len(key)] = np.frombuffer(key, dtype=np.uint8)
        self.lens = np.array([len(key) for key in table], dtype=np.int64)
        self.ints = np.zeros((RUN, INT_COLS), dtype=np.int64)
        self.floats = np.zeros((RUN, 3), dtype=np.float64)
        self.hists = np.zeros((RUN, len(HISTOGRAMS), BUCKETS + 1), dtype=np.int64)
        self.table = np.zeros((TOPICS, MAX_TOPIC_LEN), dtype=np.uint8)
        self.sizes = np.zeros(TOPICS + 1, dtype=np.int64)  # the last one: codes used
        self.slots = np.full(2 * TOPICS, -1, dtype=np.int64)
        self.names: list[str] = []
        self.device = ""
        self.dev = np.zeros(16, dtype=np.uint8)

    def run(self, buf: Any, pos: int, device: str, row: int = 0) -> tuple[int, int]:
        """Records of ``device`` (its folder's) from byte ``pos`` of ``buf`` (a uint8 array)
        into rows ``row`` on: ``(count, stop)``, ``stop`` the first byte not taken."""
        if device != self.device:
            import numpy as np

            self.device = device
            self.dev = np.frombuffer(device.encode(), dtype=np.uint8)
        count, stop = self.k.run(buf, pos, self.dev, self.keys, self.lens, self.ints, self.floats,
                                 self.hists, self.table, self.sizes, self.slots, row)  # fmt: skip
        return int(count), int(stop)

    def topic_names(self) -> list[str]:
        """The topics by code (the table's, decoded: the parser took ASCII only)."""
        for c in range(len(self.names), int(self.sizes[-1])):
            self.names.append(self.table[c, : self.sizes[c]].tobytes().decode("ascii"))
        return self.names

    def digest(self, blob: bytes, start: int, end: int) -> int:
        """The parser's digest of ``blob[start:end]`` (for items of the exact path, so that
        every copy of a record is compared by the same function)."""
        import numpy as np

        return int(self.k.digest(np.frombuffer(blob, dtype=np.uint8), start, end))


__all__ = [
    "BOOT",
    "CODE",
    "COUNTERS",
    "CPU",
    "DIGEST",
    "END",
    "INT_COLS",
    "KEYS",
    "KIND",
    "NODE",
    "RUN",
    "SEQ",
    "START",
    "T",
    "TOPIC",
    "TOPIC_LEN",
    "TOPIC_OFF",
    "WINDOW",
    "Parser",
    "available",
]

"""The compiled parser's layout, shared by :mod:`p2p.telemetry._fast` (which
wraps the parser) and :mod:`p2p.telemetry._kernel` (the parser): which keys it
knows, and the columns of the arrays it fills.  A module of its own so that
neither of the two imports the other (the wrapper loads the kernel lazily)."""

from __future__ import annotations

from typing import Final

from p2p.telemetry._schema import HISTOGRAMS, NODE_COUNTERS, TOPIC_COUNTERS

KEYS: Final = (
    "v", "id", "device", "boot", "seq", "t", "window", "kind",
    *NODE_COUNTERS, "cpu_s", "topic", *TOPIC_COUNTERS, *HISTOGRAMS,
)  # fmt: skip
"""Every key the parser knows; a record's key mask has bit ``i`` for ``KEYS[i]``."""
START, END, KIND, BOOT, SEQ, TOPIC_OFF, TOPIC_LEN, CODE, DIGEST, COUNTERS = range(10)
"""Columns of the int array: the record's bytes, kind, boot and seq, its topic's bytes
and code in the task's topic table, its digest (:meth:`Parser.digest`); from
``COUNTERS`` on, the node counters (``NODE_COUNTERS`` order) or the topic counters
(``TOPIC_COUNTERS`` order)."""
TOPICS: Final = 8192
"""Topics one task's table holds; a record of a new topic past that takes the exact
path (correct, slower)."""
INT_COLS: Final = COUNTERS + len(NODE_COUNTERS)
T, WINDOW, CPU = range(3)
"""Columns of the float array."""
NODE, TOPIC = 0, 1
"""Values of the ``KIND`` column."""
RUN: Final = 4096
"""Records parsed per call at most (the arrays' length)."""

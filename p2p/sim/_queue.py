"""The simulator's event queue: events in ``(time, sequence number)`` order.

A single binary heap of every pending event costs ``O(log n)`` tuple
comparisons per push and pop over an array of ``n`` entries scattered in
memory; at 1024 nodes ``n`` reaches hundreds of thousands, and each level of
the heap is a cache miss (issue 21).  Nearly every event is scheduled a short,
bounded time ahead of the clock (``t_pc``, ``t_t``, ``t_pp``), so a calendar
does better: time is cut into buckets of a fixed ``width``; a future bucket is
an unsorted list (a push is an append), and only the bucket being consumed is
a heap, small and hot in cache.

Invariant (what keeps the order exactly a heap's): every entry in ``_now``
belongs to a bucket ``<= _day``, and every entry in ``_later[d]`` to bucket
``d > _day``.  Since the bucket number is non-decreasing in time, the smallest
``(time, seq)`` is the head of ``_now`` whenever ``_now`` is not empty; an
event scheduled for a bucket already reached (or before it) simply joins
``_now``.  Ties in time share a bucket, so they stay ordered by sequence number.
"""

from __future__ import annotations

import heapq

_LAST_DAY = 1 << 62
"""The bucket of events at an infinite time."""

Entry = tuple[float, int, int, object]
"""``(time, sequence number, kind, item)``."""


class EventQueue:
    """A priority queue of :data:`Entry`, popped in ``(time, seq)`` order."""

    __slots__ = ("_day", "_days", "_later", "_now", "_per_unit", "_size")

    def __init__(self, width: float) -> None:
        if not width > 0:
            raise ValueError(f"bucket width must be > 0, got {width!r}")
        self._per_unit = 1.0 / width
        self._day = -1
        self._now: list[Entry] = []
        """The current bucket (and anything scheduled before it), as a heap."""
        self._later: dict[int, list[Entry]] = {}
        """Future buckets by number, unsorted."""
        self._days: list[int] = []
        """The keys of ``_later``, as a heap."""
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def push(self, entry: Entry) -> None:
        """Add ``entry``; its sequence number must be unique."""
        try:
            day = int(entry[0] * self._per_unit)
        except (OverflowError, ValueError):  # an infinite (or NaN) time: the last bucket
            day = _LAST_DAY
        self._size += 1
        if day <= self._day:
            heapq.heappush(self._now, entry)
            return
        bucket = self._later.get(day)
        if bucket is None:
            self._later[day] = [entry]
            heapq.heappush(self._days, day)
        else:
            bucket.append(entry)

    def _fill(self) -> None:
        """Make the next non-empty bucket current (``_now`` is empty)."""
        day = heapq.heappop(self._days)
        bucket = self._later.pop(day)
        heapq.heapify(bucket)
        self._now, self._day = bucket, day

    def pop_until(self, until: float | None) -> Entry | None:
        """Remove and return the smallest entry if its time is ``<= until`` (or
        ``until`` is ``None``); else ``None``, and the queue is unchanged."""
        now = self._now
        if not now:
            if not self._days:
                return None
            self._fill()
            now = self._now
        if until is not None and now[0][0] > until:
            return None
        self._size -= 1
        return heapq.heappop(now)


__all__ = ["Entry", "EventQueue"]

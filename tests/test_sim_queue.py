"""The simulator's event calendar pops exactly what a binary heap would."""

from __future__ import annotations

import heapq
import random

import pytest

from p2p.sim._queue import Entry, EventQueue


def _drain_both(rng: random.Random, width: float, steps: int) -> tuple[list[Entry], list[Entry]]:
    """Interleave pushes (ahead of, at and behind the clock; ties in time) and
    pops (some bounded by ``until``) on a heap and a calendar; return both
    pop sequences."""
    heap: list[Entry] = []
    queue = EventQueue(width)
    got_heap: list[Entry] = []
    got_queue: list[Entry] = []
    now = 0.0
    for seq in range(steps):
        roll = rng.random()
        if roll < 0.55:
            delay = rng.choice([0.0, 0.0, width / 3, rng.uniform(0, 50 * width), -width])
            time = float(round(now + delay, 1))  # rounding makes ties in time
            entry: Entry = (time, seq, 0, None)
            heapq.heappush(heap, entry)
            queue.push(entry)
        else:
            until = None if roll < 0.9 else now + rng.uniform(0, 3 * width)
            expected = heap[0] if heap and (until is None or heap[0][0] <= until) else None
            if expected is not None:
                heapq.heappop(heap)
                got_heap.append(expected)
                now = expected[0]
            popped = queue.pop_until(until)
            if popped is not None:
                got_queue.append(popped)
        assert len(queue) == len(heap)
    while heap:
        got_heap.append(heapq.heappop(heap))
    while (popped := queue.pop_until(None)) is not None:
        got_queue.append(popped)
    return got_heap, got_queue


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("width", [0.5, 1.0, 7.0])
def test_calendar_pops_in_heap_order(seed: int, width: float) -> None:
    got_heap, got_queue = _drain_both(random.Random(seed), width, 4000)
    assert got_queue == got_heap


def test_empty_and_infinite_times() -> None:
    queue = EventQueue(1.0)
    assert not queue
    assert queue.pop_until(None) is None
    queue.push((float("inf"), 0, 0, None))
    queue.push((3.0, 1, 0, None))
    assert queue.pop_until(2.0) is None
    assert len(queue) == 2
    assert queue.pop_until(None) == (3.0, 1, 0, None)
    assert queue.pop_until(None) == (float("inf"), 0, 0, None)
    assert not queue
    with pytest.raises(ValueError, match="width"):
        EventQueue(0.0)

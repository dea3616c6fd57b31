"""What a node costs its device, read from the process itself: ``p2p node --stats-every``.

One line every N seconds on stderr, for a person and for ``tools/device_budget.py``::

    p2p node: stats: rss 41.2 MB, threads 4, sockets 7, cpu 1.234 s (12.3 % of a core),
    published 1000 (100/s), delivered 950 (95/s)

(one line in fact).  ``rss`` is the resident set (``/proc/self/statm``),
``threads`` the OS threads of the process (trio's, zeroconf's and worker
threads included), ``sockets`` its open socket descriptors, ``cpu`` the
process' user + system time since it started and the share of one core since
the previous line; the rates are over the same interval.  Off Linux the
three ``/proc`` numbers read ``-1``.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import trio


@dataclass(frozen=True, slots=True)
class ProcessCounters:
    """A snapshot of the process' footprint (``-1``: not available here)."""

    rss_bytes: int
    threads: int
    sockets: int
    cpu_seconds: float
    """User + system CPU time since the process started."""


def read_counters() -> ProcessCounters:
    """The current process' counters (Linux ``/proc``; ``-1`` elsewhere)."""
    cpu = time.process_time()
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        threads = len(os.listdir("/proc/self/task"))
        sockets = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    sockets += 1
            except OSError:  # closed meanwhile
                continue
    except (OSError, ValueError, IndexError):
        rss = threads = sockets = -1
    return ProcessCounters(rss, threads, sockets, cpu)


def stats_line(
    now: ProcessCounters,
    before: ProcessCounters,
    seconds: float,
    counts: dict[str, int],
    previous: dict[str, int],
) -> str:
    """The ``stats:`` line for the interval from ``before``/``previous`` to now."""
    share = 100 * (now.cpu_seconds - before.cpu_seconds) / seconds if seconds > 0 else 0.0
    rates = {k: (counts[k] - previous.get(k, 0)) / seconds if seconds > 0 else 0.0
             for k in ("published", "delivered")}  # fmt: skip
    return (
        f"stats: rss {now.rss_bytes / 1e6:.1f} MB, threads {now.threads}, "
        f"sockets {now.sockets}, cpu {now.cpu_seconds:.3f} s ({share:.1f} % of a core), "
        f"published {counts['published']} ({rates['published']:.0f}/s), "
        f"delivered {counts['delivered']} ({rates['delivered']:.0f}/s)"
    )


async def print_stats(every: float, counts: dict[str, int]) -> None:
    """Print a ``stats:`` line on stderr every ``every`` seconds, until cancelled."""
    before, previous, then = read_counters(), dict(counts), time.monotonic()
    while True:
        await trio.sleep(every)
        now, at = read_counters(), time.monotonic()
        line = stats_line(now, before, at - then, counts, previous)
        print(f"p2p node: {line}", file=sys.stderr, flush=True)
        before, previous, then = now, dict(counts), at

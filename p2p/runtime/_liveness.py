"""Incarnations of runtime nodes, and the detector settings a node runs with.

A process that restarts with the same identity must come back as a *new
incarnation*: the pub/sub core and the failure detector treat every older
incarnation of the id as crashed (``docs/failures.md``).  The runtime keeps
no state on disk, so the incarnation comes from the wall clock:

* a process picks ``time.time_ns() // 1000`` (microseconds since the Unix
  epoch) when its node starts, and after a false suspicion at least one more
  than its current one (:func:`next_incarnation`);
* it signs it into its discovery record (extra field ``inc``), so every
  member that learns the record learns the incarnation with the address, and
  a forged incarnation is as impossible as a forged address;
* records without ``inc`` (older nodes) count as ``issued_at`` seconds in
  microseconds, the same scale.

Monotonic across restarts as long as the host clock does not step back by
more than the restart takes.  Below ``2**63`` (the wire's counter limit) until
the year 294 000.  The cost: an incarnation takes 9 CBOR bytes instead of 1
in each round id and publication id on the wire.
"""

from __future__ import annotations

import math
import time

import cbor2

from p2p._membership import Peer
from p2p.wire import COUNTER_LIMIT
from vcube import DetectorConfig

INC_FIELD = "inc"
"""Name of the signed discovery-record field that carries the incarnation."""


def new_incarnation() -> int:
    """The incarnation of a node starting now: microseconds since the Unix epoch."""
    return time.time_ns() // 1000


def next_incarnation(current: int) -> int:
    """A fresh incarnation strictly above ``current`` (after being suspected)."""
    return max(new_incarnation(), current + 1)


def record_incarnation(record: bytes, issued_at: int) -> int:
    """The incarnation a (verified) discovery record announces.

    ``inc`` if the record carries a valid one, else ``issued_at`` in
    microseconds; never raises (a record the node did not sign itself, such
    as a test's placeholder, falls back too).
    """
    fallback = max(0, min(issued_at * 1_000_000, COUNTER_LIMIT - 1))
    try:
        outer = cbor2.loads(record)
        body = cbor2.loads(outer[1])
        inc = body.get(INC_FIELD)
    except Exception:  # not a record this code can read: it was verified elsewhere
        return fallback
    if type(inc) is int and 0 <= inc < COUNTER_LIMIT:
        return inc
    return fallback


REVIVE_FOR = 600.0
"""Seconds after a suspicion during which the suspected member is still probed
now and then (``NodeConfig.detector_revive``): a partition that heals within
this time merges back by itself."""


def detector_config(
    interval: float, timeout: float | None, attempts: int, stretch: float = 1.0, revive: int = 0
) -> DetectorConfig:
    """The detector settings of ``NodeConfig`` (``timeout=None``: the interval;
    ``stretch``: how many times the timeout a loaded host may give a probe;
    ``revive``: rounds between probes of a suspected member, 0 for none).

    The runtime expires probes at their deadline, so the timeout is what a
    peer gets to answer each attempt.  One interval is what it got when probes
    expired at rounds: pushing suspicions and probing on a broken connection
    made detection faster without shortening that (a shorter timeout detects
    faster still, and tolerates shorter stalls).
    """
    base = interval if timeout is None else timeout
    valid = isinstance(interval, int | float) and math.isfinite(interval) and interval > 0
    rounds = max(1, math.ceil(REVIVE_FOR / interval)) if valid else 1  # else refused below
    return DetectorConfig(
        interval=interval,
        timeout=base,
        attempts=attempts,
        max_timeout=base * stretch,
        revive=revive,
        revive_rounds=rounds,
    )


def incarnation_of(peer: Peer) -> int:
    """The incarnation ``peer``'s verified record announces."""
    return record_incarnation(peer.record, peer.issued_at)


__all__ = [
    "INC_FIELD",
    "detector_config",
    "incarnation_of",
    "new_incarnation",
    "next_incarnation",
    "record_incarnation",
]

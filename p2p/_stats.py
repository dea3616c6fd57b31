"""The one percentile rule of the project: nearest rank, pure.

The ``q``-th percentile of ``n`` ordered values is the value of rank
``ceil(q / 100 * n)`` (1-based, at least 1): the smallest value with at
least ``q`` % of the values at or below it.  The simulator's metrics, the
benchmarks, the game's latency report and the telemetry histograms all use
it (they used to disagree by one rank).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

__all__ = ["nearest_rank", "percentile_of"]


def nearest_rank(n: int, q: float) -> int:
    """The 1-based rank of the ``q``-th percentile (0 < q <= 100) of ``n >= 1``
    values.  Rounded in ``q`` to 1e-9, so 95 % of 100 values is rank 95, not
    96 (``0.95 * 100`` is ``95.00000000000001`` in floating point)."""
    if n < 1 or not 0 < q <= 100:
        raise ValueError(f"need n >= 1 and 0 < q <= 100, got n={n}, q={q}")
    return min(n, max(1, math.ceil(q * n / 100 - 1e-9)))


def percentile_of(ordered: Sequence[T], q: float) -> T:
    """The ``q``-th percentile (0 < q <= 100) of an ascending, non-empty sequence."""
    return ordered[nearest_rank(len(ordered), q) - 1]

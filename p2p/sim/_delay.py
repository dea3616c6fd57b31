"""The packet delay model of thesis §4.5.1 (Kurose and Ross)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from p2p._errors import ScenarioError


@dataclass(frozen=True, slots=True, kw_only=True)
class DelayModel:
    """Each packet costs ``t_pc + t_q + t_t + t_pp`` units of time (u.t.).

    ``t_q`` is not a parameter: it emerges from the per-node sending queue,
    which transmits one packet at a time.  There is no network broadcast: a
    packet to ``k`` destinations is ``k`` copies in the queue.
    """

    tpc: float = 1.0
    """Processing time of one input (received packet) by a node."""
    tt: float = 1.0
    """Transmission time: how long a packet occupies the sender's link."""
    tpp_mean: float = 100.0
    """Mean propagation time."""
    tpp_stdev: float = 25.0
    """Standard deviation of the propagation time (normal, clipped at 0)."""

    def __post_init__(self) -> None:
        # A NaN compares false with everything and an infinity never lets a
        # packet arrive: both would run silently (or for ever), so say which.
        for name in ("tpc", "tt", "tpp_mean", "tpp_stdev"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ScenarioError(
                    f"delay parameter {name} must be a finite non-negative number, got {value!r}"
                )

    def propagation(self, rng: random.Random) -> float:
        """One draw of ``t_pp ~ Normal(mean, stdev)``, never negative."""
        if self.tpp_stdev == 0:
            return self.tpp_mean
        return max(0.0, rng.gauss(self.tpp_mean, self.tpp_stdev))

"""The packet delay model of thesis §4.5.1 (Kurose and Ross)."""

from __future__ import annotations

import random
from dataclasses import dataclass


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
        if min(self.tpc, self.tt, self.tpp_mean, self.tpp_stdev) < 0:
            raise ValueError("delay parameters must be non-negative")

    def propagation(self, rng: random.Random) -> float:
        """One draw of ``t_pp ~ Normal(mean, stdev)``, never negative."""
        if self.tpp_stdev == 0:
            return self.tpp_mean
        return max(0.0, rng.gauss(self.tpp_mean, self.tpp_stdev))

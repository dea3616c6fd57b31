"""Probe timeouts that stretch with measured delay and local health (sans-IO).

A fixed probe timeout is right on an idle LAN and wrong on a loaded host: when
64 node processes share two cores, an answer can take seconds, every timeout
becomes a false suspicion, and each false suspicion costs a restart and new
connections, which loads the host further.  Two measures, both from memberlist
and TCP, break that loop:

* **Round-trip estimates** (Jacobson/Karels, RFC 6298): each answered first
  probe to a node is a sample; the node's timeout is ``srtt + 4 * rttvar``,
  never below the configured ``timeout``.  A node with no sample yet gets the
  ceiling: like TCP's initial timeout, the first one is conservative, and a
  node that just started (or restarted) is at its busiest, with connections
  to every member to open and subscriptions to announce.
  Retried probes give no sample (Karn): their answer is ambiguous.
* **Local health** (Lifeguard's multiplier): evidence that a suspicion was
  false (a suspected node heard from again, or restarting right after it was
  suspected, or this node learning it was suspected itself), and this
  node's own loop stalls, raise a score ``h`` up to ``max_health``; every
  timeout is multiplied by ``1 + h``.  The score falls by one after
  ``calm_rounds`` rounds without such evidence.

Whatever the estimates, a timeout stays within ``[timeout, max_timeout]``, so
detection keeps a bound: ``attempts * max_timeout`` per check (one attempt
more after the detector's self-doubt).  With
``max_timeout == timeout`` (the default of :class:`vcube.DetectorConfig`) every
timeout is the configured one, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_ALPHA = 1 / 8
_BETA = 1 / 4
"""RFC 6298's gains for the smoothed round trip and its variation."""


@dataclass(slots=True)
class RttEstimate:
    """A smoothed round trip and its mean deviation (RFC 6298, section 2)."""

    srtt: float
    rttvar: float

    @classmethod
    def first(cls, rtt: float) -> RttEstimate:
        return cls(rtt, rtt / 2)

    def add(self, rtt: float) -> None:
        """Fold one sample in (variation first, from the old mean, as the RFC says)."""
        self.rttvar = (1 - _BETA) * self.rttvar + _BETA * abs(self.srtt - rtt)
        self.srtt = (1 - _ALPHA) * self.srtt + _ALPHA * rtt

    def rto(self) -> float:
        """The retransmission timeout this estimate gives."""
        return self.srtt + 4 * self.rttvar


@dataclass(slots=True)
class ProbeTimeouts:
    """Per-node probe timeouts (see the module docstring).

    Invariant: ``base <= timeout(node) <= ceiling`` for every node, and
    ``0 <= health <= max_health``.  Nothing here reads a clock: samples and
    rounds come from the detector, which gets ``now`` from its driver.
    """

    base: float
    ceiling: float
    max_health: int = 8
    calm_rounds: int = 5
    _health: int = 0
    _calm: int = 0
    _peers: dict[int, RttEstimate] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ceiling = max(self.base, self.ceiling)

    @property
    def adaptive(self) -> bool:
        """Whether timeouts can differ from the base (``ceiling > base``)."""
        return self.ceiling > self.base

    @property
    def health(self) -> int:
        """Lifeguard's local health score: 0 is healthy."""
        return self._health

    def timeout(self, node: int) -> float:
        """How long a probe to ``node`` leaving now may go unanswered."""
        if not self.adaptive:
            return self.base
        est = self._peers.get(node)
        if est is None:
            return self.ceiling
        return min(self.ceiling, max(self.base, est.rto()) * (1 + self._health))

    def retry(self) -> float:
        """The timeout of a retry after a silent probe, when nothing hints at a
        crash: the ceiling.  TCP backs its timer off on each retransmission
        (RFC 6298, 5.5); one step to the top here, since the retry's silence
        is what makes the suspicion.  A live node starved of CPU for a few
        seconds is then not suspected; a crashed process is, in ordinary
        timeouts, when its peers' connections to it are refused (the
        detector's hinted probes)."""
        return self.ceiling

    def sample(self, node: int, rtt: float) -> None:
        """A first probe to ``node`` was answered ``rtt`` seconds after it left."""
        rtt = max(0.0, rtt)
        est = self._peers.get(node)
        if est is None:
            self._peers[node] = RttEstimate.first(rtt)
        else:
            est.add(rtt)

    def false_suspicion(self) -> None:
        """Evidence that a suspicion (ours or another node's) was false."""
        self._worse()

    def stalled(self) -> None:
        """This node's own loop lagged: its answers, and its reading of
        answers, are late, so its probes deserve more time for a while."""
        self._worse()

    def _worse(self) -> None:
        self._health = min(self.max_health, self._health + 1)
        self._calm = 0

    def round(self) -> None:
        """One testing round passed: health recovers one step per calm stretch."""
        self._calm += 1
        if self._calm >= self.calm_rounds and self._health:
            self._health -= 1
            self._calm = 0

    def forget(self, node: int) -> None:
        """``node`` restarted or left: its round trips say nothing of the next life."""
        self._peers.pop(node, None)


__all__ = ["ProbeTimeouts", "RttEstimate"]

"""What the failure detector answers its driver with, and its counters.

Every call of :class:`~vcube._detector.Detector` returns a list of
:data:`DetectorOutput`: messages to send (:class:`SendDetector`) and the
membership verdicts (:class:`Joined`, :class:`Left`, :class:`Suspected`,
:class:`Corrected`, :class:`Restarted`, :class:`SelfSuspected`,
:class:`Reported`).  :class:`DetectorStats` is its cumulative counters.
"""

from __future__ import annotations

from vcube._detmsg import DetectorMessage
from vcube._hot import hot


@hot
class SendDetector:
    """Send ``msg`` to ``dest``."""

    dest: int
    msg: DetectorMessage


@hot
class Joined:
    """``node`` (at ``incarnation``) is now a member, believed correct."""

    node: int
    incarnation: int


@hot
class Left:
    """``node`` left gracefully and is forgotten."""

    node: int
    incarnation: int


@hot
class Suspected:
    """``node`` at ``incarnation`` is now suspected (treat that incarnation as crashed)."""

    node: int
    incarnation: int


@hot
class Corrected:
    """``node`` at ``incarnation`` was wrongly suspected and is believed correct again."""

    node: int
    incarnation: int


@hot
class Restarted:
    """``node`` came back as incarnation ``new``; ``old`` is gone for good."""

    node: int
    old: int
    new: int


@hot
class SelfSuspected:
    """This node read ``(incarnation, counter)`` about itself: it was suspected
    (same incarnation, higher counter) or the network holds a newer incarnation
    of its id.  The driver should restart the upper layers and call
    :meth:`Detector.reincarnate` with an incarnation above ``incarnation``."""

    incarnation: int
    counter: int


@hot
class Reported:
    """A message said ``node``'s ``incarnation`` is suspected, and this detector
    does not know ``node`` (it never joined, or left): not a member here, but
    the driver may treat that incarnation as crashed (a node that learns of a
    subscriber only through another node's view must also learn that it died).
    Reported once per node and incarnation."""

    node: int
    incarnation: int


DetectorOutput = (
    SendDetector | Joined | Left | Suspected | Corrected | Restarted | SelfSuspected | Reported
)


@hot
class DetectorStats:
    """Cumulative counters for measurement.

    ``checks`` counts liveness checks (one per monitored node per tick, whether
    traffic answered it or a probe was needed); ``probes`` the checks that sent
    a :class:`Probe`; ``timeouts`` the suspicions this node raised itself;
    ``pushes`` the :class:`Push` messages sent (its own and forwarded ones;
    their entries count in ``entries_sent``); ``revivals`` the probes sent
    to suspected nodes (:attr:`DetectorConfig.revive`, counted in ``probes`` too);
    ``doubts`` the accusations held back because the accused was heard from
    within a timeout (:meth:`Detector._doubt`).
    """

    rounds: int
    checks: int
    probes: int
    replies: int
    entries_sent: int
    entries_received: int
    timeouts: int
    pushes: int
    revivals: int
    doubts: int


_ROUNDS, _CHECKS, _PROBES, _REPLIES, _SENT, _RECEIVED, _TIMEOUTS, _PUSHES, _REVIVALS, _DOUBTS = (
    range(10)
)
"""Indices of the counters behind :class:`DetectorStats`, in its field order."""

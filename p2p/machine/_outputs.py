"""The outputs of :class:`~p2p.machine.NodeMachine`: what a driver carries out.

One typed union (:data:`NodeOutput`: the core's ``topics.Output`` and
:data:`MachineOutput`), frozen dataclasses, dispatched once per driver.
"""

from __future__ import annotations

from collections.abc import Callable

from p2p._membership import Peer
from p2p.machine._recovery import Release
from p2p.machine._seeds import ExchangeWithSeed, LeaveSeed
from p2p.wire import Control
from topics import Output
from vcube._hot import hot


@hot
class SendControl:
    """Send the control message ``msg`` (a detector message or a LEAVE) to ``dest``."""

    dest: int
    msg: Control


@hot
class SendExchange:
    """Send signed membership ``records`` to ``dest`` (``reply``: it answers
    with its own)."""

    dest: int
    records: tuple[bytes, ...]
    reply: bool


@hot
class MemberUp:
    """``node`` joined this node's view as ``incarnation`` (``reason``:
    ``discovered`` or ``restarted``), or, up already, is now ``incarnation``
    (``restarted``: a connection to its old life must not carry more).  The
    core already knows it."""

    node: int
    incarnation: int
    reason: str


@hot
class MemberDown:
    """Incarnations of ``node`` up to ``incarnation`` are over (``reason``:
    ``suspected``, ``left``, ``revoked``, ``crashed``).  ``was_up``: it was in
    the view and left it now (a driver drops its link); otherwise only an
    older incarnation, or one never admitted, was declared over.  The outputs
    of the core's repair follow this one."""

    node: int
    incarnation: int
    reason: str
    was_up: bool


@hot
class SuspicionCorrected:
    """``node``, suspected by this node, answers again; it comes back as a new
    incarnation once it learns of the suspicion (the core treats a suspected
    incarnation as crashed for good)."""

    node: int


@hot
class Reincarnated:
    """This node was suspected: its core restarted as ``incarnation`` (it was
    ``previous``).  Core packets of the old life still queued must be dropped;
    the outputs that follow re-subscribe every topic of :attr:`NodeMachine.topics`."""

    previous: int
    incarnation: int


@hot
class Superseded:
    """Another process runs this node's identity as the newer ``incarnation``,
    alive (the detector holds it unsuspected): the identity was started twice
    (a copied node directory).  The newest start keeps it; this machine stops
    acting (no reincarnation above it, which would start a leapfrog of
    restarts, nor probes or accusations) and the driver should stop the node
    with an error.  Reported once."""

    incarnation: int


@hot
class Stalled:
    """The driver handled the timer ``lag`` seconds late (this process was not
    running): ``moved`` probes were given more time instead of accusing others
    of this node's own slowness (Lifeguard's local health)."""

    lag: float
    moved: int


@hot
class RoundStarted:
    """A detector round ran (once per ``interval``, on a fixed grid)."""


@hot
class Refused:
    """A frame of ``peer`` broke the protocol (``reason``): what came before it in
    the frame was taken and its outputs precede this one; the rest was not.
    The driver closes the connection it came on (a simulated peer is honest,
    so the simulator never sees one)."""

    peer: int
    reason: str


@hot
class RevocationsAdopted:
    """This node holds the fleet's revocation list ``serial`` now; ``fresh`` are
    the nodes it revokes that were not revoked before (each one's
    :class:`MemberDown` follows), ``self_revoked``: the list names this node."""

    serial: int
    fresh: tuple[int, ...]
    self_revoked: bool


MachineOutput = (
    SendControl
    | SendExchange
    | MemberUp
    | MemberDown
    | SuspicionCorrected
    | Reincarnated
    | Superseded
    | Stalled
    | RoundStarted
    | Release
    | Refused
    | RevocationsAdopted
    | ExchangeWithSeed
    | LeaveSeed
)
"""The outputs of this module; a machine's output lists mix them with the core's."""

NodeOutput = Output | MachineOutput
"""Everything a :class:`NodeMachine` call returns: the core's outputs
(``topics.Output``) and :data:`MachineOutput`, one typed union a driver
dispatches once."""

Out = list[NodeOutput]
"""Outputs in the order the driver must carry them out."""


Verify = Callable[[bytes], tuple[Peer, int]]
"""Checks a membership record's signature and fleet membership and returns the
peer it names with the incarnation it announces; raises on a forged record
(the driver closes the connection it came on)."""

VerifyRevocations = Callable[[bytes], tuple[int, frozenset[int]]]
"""Checks an encoded revocation list against the fleet's key and returns its
serial and the nodes it revokes; raises on a forged or malformed one."""


__all__ = [
    "ExchangeWithSeed",
    "LeaveSeed",
    "MachineOutput",
    "MemberDown",
    "MemberUp",
    "NodeOutput",
    "Out",
    "Refused",
    "Reincarnated",
    "Release",
    "RevocationsAdopted",
    "RoundStarted",
    "SendControl",
    "SendExchange",
    "Stalled",
    "Superseded",
    "SuspicionCorrected",
    "Verify",
    "VerifyRevocations",
]

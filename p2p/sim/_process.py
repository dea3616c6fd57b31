"""What a simulated process is to the detector mode's driver (``p2p.sim._members``).

* :class:`Process`: one running process of a node id, as the one driver loop
  (``_Membership.feed``, ``frame``, ``drive``) sees it: its machine, and what
  each kind of machine output does for it;
* :class:`ElderRouting`: what the driver asks of the ids started twice
  (``p2p.sim._twin``), declared here so that no module imports in a circle;
* the simulated membership records and revocation lists (the runtime's are
  signed), and the seed exchange's schedule in detector intervals.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from p2p._errors import P2PError
from p2p._membership import Peer
from p2p.machine import (
    ExchangeWithSeed,
    MemberDown,
    MemberUp,
    NodeMachine,
    Reincarnated,
    Release,
    SendControl,
    SendExchange,
)
from topics import Output


def sim_record(node: int, incarnation: int) -> bytes:
    """A simulated node's membership record (the runtime's are signed)."""
    return b"sim" + node.to_bytes(8, "big") + incarnation.to_bytes(8, "big")


def verify_sim_record(record: bytes) -> tuple[Peer, int]:
    """The peer and incarnation a simulated record names."""
    if len(record) != 19 or not record.startswith(b"sim"):
        raise P2PError(f"not a simulated membership record: {record!r}")
    node, inc = int.from_bytes(record[3:11], "big"), int.from_bytes(record[11:], "big")
    return Peer(node, "sim", 0, record, inc), inc


def sim_revocations(serial: int, nodes: Iterable[int]) -> bytes:
    """A simulated revocation list (the runtime's are signed by the fleet)."""
    return b"simrev" + b"".join(n.to_bytes(8, "big") for n in (serial, *sorted(nodes)))


def verify_sim_revocations(blob: bytes) -> tuple[int, frozenset[int]]:
    """The serial and nodes of a simulated revocation list."""
    if not blob.startswith(b"simrev") or (len(blob) - 6) % 8 or len(blob) < 14:
        raise P2PError(f"not a simulated revocation list: {blob!r}")
    ints = [int.from_bytes(blob[i : i + 8], "big") for i in range(6, len(blob), 8)]
    return ints[0], frozenset(ints[1:])


SEED_INTERVAL = 30.0
"""Detector intervals between exchanges with a seed (the runtime's default
``seed_interval``, 30 s, at its 1 s rounds)."""
SEED_BACKOFF = 0.25
"""Detector intervals before a failed seed exchange is tried again (doubling)."""


class ElderRouting(Protocol):
    """What the detector mode asks of the ids started twice (``p2p.sim._twin.Twins``,
    which routes events to their older processes: declared here so that the
    import only goes from ``_twin`` to ``_members``)."""

    def catch(self, sender: int, node: int, life: int, what: tuple[Any, ...]) -> bool: ...
    def divert_control(self, src: int, dst: int, msg: Any, start: float) -> bool: ...
    def seen_newer(self, dest: int, src: int, start: float) -> None: ...
    def seen(self, node: int, life: int, about: int, inc: int) -> None: ...
    def new_life(self, observer: int, o: MemberUp, at: float) -> None: ...
    def any_running(self) -> bool: ...


class Process(Protocol):
    """One running process of a node id, as the driver loop
    (:meth:`_Membership.drive`) sees it: its machine, and what each kind of
    machine output does for it.  The id's newest process (:class:`_Newest`,
    the engine's tables) records what it does in the trace; the older
    process of an id started twice (``p2p.sim._twin.Elder``) counts it.
    Every input reaches either through :meth:`_Membership.feed` or
    :meth:`_Membership.frame`."""

    node: int

    @property
    def machine(self) -> NodeMachine: ...
    def send(self, o: SendControl | SendExchange | ExchangeWithSeed, start: float) -> None: ...
    def up(self, o: MemberUp, at: float) -> None: ...
    def down(self, o: MemberDown, at: float) -> None: ...
    def reincarnated(self, o: Reincarnated, at: float) -> None: ...
    def superseded(self, at: float) -> bool:
        """Whether the process stops on reading that a newer start of its id runs."""

    def released(self, o: Release, at: float) -> None: ...
    def emit(self, at: float, ready: float, outputs: list[Output]) -> None:
        """Core outputs made at ``at``; the CPU is busy and sends leave from ``ready``."""

    def emit_frame(self, done: float, outputs: list[Any]) -> None:
        """Everything the machine gave for a link packet handled by ``done``."""

    def arm(self) -> None:
        """Queue the machine's timer if it moved (the contract: re-read after every call)."""


def addressed(o: SendControl | SendExchange | ExchangeWithSeed) -> tuple[int, Any]:
    """Where a machine's control output goes in the simulator, and what travels:
    a seed's address is its node id, and an exchange travels as itself."""
    msg = o.msg if type(o) is SendControl else o
    dest = int(o.address) if isinstance(o, ExchangeWithSeed) else o.dest
    return dest, msg


__all__ = [
    "SEED_BACKOFF",
    "SEED_INTERVAL",
    "ElderRouting",
    "Process",
    "addressed",
    "sim_record",
    "sim_revocations",
    "verify_sim_record",
    "verify_sim_revocations",
]

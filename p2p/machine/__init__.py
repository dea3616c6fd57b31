"""One node's whole protocol state, sans-IO: :class:`NodeMachine` (DESIGN.md §1).

The trio runtime (:class:`p2p.Node`) and the simulator (:mod:`p2p.sim`) both
run it; it never reads a clock or does I/O.
"""

from p2p.machine._frontier import ENVELOPE_SIZE, GAP, SKIP, Frontier, envelope_of
from p2p.machine._history import History, HistoryLimits
from p2p.machine._machine import DIGEST_REFRESH, DIGEST_RESYNC, NodeMachine
from p2p.machine._outputs import (
    MachineOutput,
    MemberDown,
    MemberUp,
    NodeOutput,
    Refused,
    Reincarnated,
    RevocationsAdopted,
    RoundStarted,
    SendControl,
    SendExchange,
    Stalled,
    Superseded,
    SuspicionCorrected,
    Verify,
    VerifyRevocations,
)
from p2p.machine._recovery import ANSWER_BURST, HELD, Recovery, RecoveryConfig, Release
from p2p.machine._seeds import ExchangeWithSeed, LeaveSeed, Seeds

__all__ = [
    "ANSWER_BURST",
    "DIGEST_REFRESH",
    "DIGEST_RESYNC",
    "ENVELOPE_SIZE",
    "GAP",
    "HELD",
    "SKIP",
    "ExchangeWithSeed",
    "Frontier",
    "History",
    "HistoryLimits",
    "LeaveSeed",
    "MachineOutput",
    "MemberDown",
    "MemberUp",
    "NodeMachine",
    "NodeOutput",
    "Refused",
    "RevocationsAdopted",
    "Recovery",
    "RecoveryConfig",
    "Reincarnated",
    "Release",
    "RoundStarted",
    "Seeds",
    "SendControl",
    "SendExchange",
    "Stalled",
    "Superseded",
    "SuspicionCorrected",
    "Verify",
    "VerifyRevocations",
    "envelope_of",
]

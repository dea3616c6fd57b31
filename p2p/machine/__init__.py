"""One node's whole protocol state, sans-IO: :class:`NodeMachine` (DESIGN.md §1).

The trio runtime (:class:`p2p.Node`) and the simulator (:mod:`p2p.sim`) both
run it; it never reads a clock or does I/O.
"""

from p2p.machine._frontier import ENVELOPE_SIZE as ENVELOPE_SIZE
from p2p.machine._frontier import GAP as GAP
from p2p.machine._frontier import SKIP as SKIP
from p2p.machine._frontier import Frontier as Frontier
from p2p.machine._frontier import envelope_of as envelope_of
from p2p.machine._history import DEP_COST as DEP_COST
from p2p.machine._history import Deps as Deps
from p2p.machine._history import History as History
from p2p.machine._history import HistoryLimits as HistoryLimits
from p2p.machine._history import Kept as Kept
from p2p.machine._machine import DIGEST_REFRESH as DIGEST_REFRESH
from p2p.machine._machine import DIGEST_RESYNC as DIGEST_RESYNC
from p2p.machine._machine import NodeMachine as NodeMachine
from p2p.machine._outputs import MachineOutput as MachineOutput
from p2p.machine._outputs import MemberDown as MemberDown
from p2p.machine._outputs import MemberUp as MemberUp
from p2p.machine._outputs import NodeOutput as NodeOutput
from p2p.machine._outputs import Refused as Refused
from p2p.machine._outputs import Reincarnated as Reincarnated
from p2p.machine._outputs import RevocationsAdopted as RevocationsAdopted
from p2p.machine._outputs import RoundStarted as RoundStarted
from p2p.machine._outputs import SendControl as SendControl
from p2p.machine._outputs import SendExchange as SendExchange
from p2p.machine._outputs import Stalled as Stalled
from p2p.machine._outputs import Superseded as Superseded
from p2p.machine._outputs import SuspicionCorrected as SuspicionCorrected
from p2p.machine._outputs import Verify as Verify
from p2p.machine._outputs import VerifyRevocations as VerifyRevocations
from p2p.machine._recovery import ANSWER_BURST as ANSWER_BURST
from p2p.machine._recovery import HELD as HELD
from p2p.machine._recovery import Recovery as Recovery
from p2p.machine._recovery import RecoveryConfig as RecoveryConfig
from p2p.machine._recovery import Release as Release
from p2p.machine._seeds import ExchangeWithSeed as ExchangeWithSeed
from p2p.machine._seeds import LeaveSeed as LeaveSeed
from p2p.machine._seeds import Seeds as Seeds

__all__ = sorted(name for name in globals() if not name.startswith("_"))
"""Every name imported above."""

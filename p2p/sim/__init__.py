"""Deterministic discrete-event simulator running the sans-IO protocol cores."""

from p2p.sim._checks import TraceChecker as TraceChecker
from p2p.sim._checks import Violation as Violation
from p2p.sim._checks import assert_no_violations as assert_no_violations
from p2p.sim._checks import assert_trace as assert_trace
from p2p.sim._checks import assert_views as assert_views
from p2p.sim._checks import check_trace as check_trace
from p2p.sim._checks import check_views as check_views
from p2p.sim._checks import format_violations as format_violations
from p2p.sim._delay import DelayModel as DelayModel
from p2p.sim._engine import AGGREGATION as AGGREGATION
from p2p.sim._engine import DETECTOR as DETECTOR
from p2p.sim._engine import MEMBERSHIP as MEMBERSHIP
from p2p.sim._engine import PROTOCOLS as PROTOCOLS
from p2p.sim._engine import Core as Core
from p2p.sim._engine import LinkDelay as LinkDelay
from p2p.sim._engine import Listener as Listener
from p2p.sim._engine import Simulation as Simulation
from p2p.sim._recorder import Recorder as Recorder
from p2p.sim._recorder import TraceEvent as TraceEvent
from p2p.sim._recorder import summarize as summarize
from p2p.sim._scenario import Action as Action
from p2p.sim._scenario import Script as Script
from p2p.sim._scenario import Step as Step
from p2p.sim._scenario import legal_script as legal_script
from p2p.sim._scenario import load_scenario as load_scenario
from p2p.sim._scenario import parse_scenario as parse_scenario

__all__ = sorted(name for name in globals() if not name.startswith("_"))
"""Every name imported above."""

"""Deterministic discrete-event simulator running the sans-IO protocol cores."""

from p2p.sim._checks import (
    TraceChecker,
    Violation,
    assert_no_violations,
    assert_trace,
    assert_views,
    check_trace,
    check_views,
    format_violations,
)
from p2p.sim._delay import DelayModel
from p2p.sim._engine import (
    AGGREGATION,
    DETECTOR,
    MEMBERSHIP,
    PROTOCOLS,
    Core,
    LinkDelay,
    Listener,
    Simulation,
)
from p2p.sim._recorder import Recorder, TraceEvent, summarize
from p2p.sim._scenario import Action, Script, Step, legal_script, load_scenario, parse_scenario

__all__ = [
    "AGGREGATION",
    "DETECTOR",
    "MEMBERSHIP",
    "PROTOCOLS",
    "Action",
    "Core",
    "DelayModel",
    "LinkDelay",
    "Listener",
    "Recorder",
    "Script",
    "Simulation",
    "Step",
    "TraceChecker",
    "TraceEvent",
    "Violation",
    "assert_no_violations",
    "assert_trace",
    "assert_views",
    "check_trace",
    "check_views",
    "format_violations",
    "legal_script",
    "load_scenario",
    "parse_scenario",
    "summarize",
]

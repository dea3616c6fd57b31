"""DESIGN.md §1: ``NodeMachine.receive`` is the one door into a node.

No driver writes the machine's state or calls its core behind its back: the
trio runtime and the simulator's machine drivers may call the machine's
methods and read its state (stats, views), nothing else.  These tests walk
their sources; the second one shows the walk finds what it looks for.
"""

from __future__ import annotations

import ast
from pathlib import Path

import p2p

ROOT = Path(p2p.__file__).parent

DRIVERS = [
    *sorted((ROOT / "runtime").glob("*.py")),
    *sorted(p for p in (ROOT / "sim").glob("*.py") if p.name != "_frames.py"),
    ROOT / "aio.py",
    ROOT / "fleet.py",
]
"""The sources that drive a ``NodeMachine`` (the simulator's other protocols,
SRPT and the causal broadcast, run bare cores of their own: their calls are
on a local ``core``, not a machine's; ``p2p/sim/_frames.py`` adapts the causal
broadcast, whose own ``core`` is a ``CausalBroadcast``)."""

CORE_QUERIES = {
    "believed_dead",
    "view",
    "is_subscribed",
    "is_confirmed",
    "idle",
    "subscriber_incarnations",
    "children",
}
"""The core's read-only methods a driver may call (stats and views)."""

MACHINE_TABLES = {"alive", "incs", "dead", "heard", "revoked", "peers", "departed", "topics"}
"""The machine's membership tables (the runtime keeps read-only aliases ``_alive`` and so on)."""

MUTATORS = {"add", "update", "discard", "remove", "pop", "setdefault", "clear", "append", "restore"}


def _is_machine(node: ast.expr) -> bool:
    """``machine``, ``m``, ``x.machine`` or ``x.machines[...]``: a ``NodeMachine``."""
    if isinstance(node, ast.Name):
        return node.id in {"machine", "m"}
    if isinstance(node, ast.Attribute):
        return node.attr == "machine"
    if isinstance(node, ast.Subscript):
        return isinstance(node.value, ast.Attribute) and node.value.attr == "machines"
    return False


def _is_table(node: ast.expr) -> bool:
    """A machine table, through the machine or a runtime alias (``self._alive``)."""
    if not isinstance(node, ast.Attribute):
        return False
    if _is_machine(node.value) and node.attr in MACHINE_TABLES | {"frontier", "recovery"}:
        return True
    alias = node.attr.startswith("_") and node.attr[1:] in MACHINE_TABLES
    return isinstance(node.value, ast.Name) and alias


def _is_core(node: ast.expr) -> bool:
    """``x.core``: a machine's core (the runtime's ``self.core`` is the machine's)."""
    return isinstance(node, ast.Attribute) and node.attr == "core"


def violations(source: str, name: str) -> list[str]:
    """Where ``source`` writes machine state or calls the core behind the machine."""
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and _is_machine(t.value):
                found.append(f"{where}: assigns machine.{t.attr}")
            elif isinstance(t, ast.Subscript) and _is_table(t.value):
                found.append(f"{where}: writes into a machine table")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, method = node.func.value, node.func.attr
            if _is_core(owner) and method not in CORE_QUERIES:
                found.append(f"{where}: calls core.{method}")
            elif _is_table(owner) and method in MUTATORS:
                found.append(f"{where}: {method} on a machine table")
    return found


def test_no_driver_reaches_behind_the_machine() -> None:
    found = [v for path in DRIVERS for v in violations(path.read_text(), path.name)]
    assert found == []


def test_the_walk_finds_each_kind_of_breach() -> None:
    """Each pattern the rule forbids is reported (so the test above can fail)."""
    breaches = {
        "self.machine.pending = []": "assigns machine.pending",
        "m.record = b''": "assigns machine.record",
        "self.machine.heard[peer] = 3": "writes into a machine table",
        "self._heard[peer] = None": "writes into a machine table",
        "m.heard.setdefault(peer, None)": "setdefault on a machine table",
        "self._revoked.update(nodes)": "update on a machine table",
        "self.core.receive(peer, packet, now)": "calls core.receive",
        "m.core.first_seq(3)": "calls core.first_seq",
        "m.frontier.restore(kept)": "restore on a machine table",
    }
    for line, what in breaches.items():
        assert [what in v for v in violations(line, "x")] == [True], line
    allowed = [
        "self.core.believed_dead(dest)",
        "self.core.view(topic)",
        "out = self.machine.receive(peer, body, now)",
        "n = len(self._alive)",
        "local = {}; local[1] = 2",
        "self.revoked.setdefault(node, now)",  # a driver's own table of that name
    ]
    for line in allowed:
        assert violations(line, "x") == [], line

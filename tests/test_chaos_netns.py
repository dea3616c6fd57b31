"""Chaos system test: 8 ``p2p node`` processes in namespaces, SIGKILLed and restarted
mid-stream (``tests/_chaos.py``); traces checked for every promise of
docs/failures.md, times to detect and repair reported.

Needs root and iproute2; fails (does not skip) without them: CI runs as root.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import _chaos
import pytest
from _netns import Lan
from conftest import LAN_HOSTS
from test_system_netns import drop_last_delivery, duplicate_delivery, swap_same_source, tails


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkilled_and_restarted_nodes_keep_every_promise(lan: Lan, tmp_path: Path) -> None:
    """Kills of a publisher and two relays, two restarts: nothing lost, duplicated or
    reordered for the nodes that stayed up, and every kill detected by all of them."""
    assert LAN_HOSTS == _chaos.NODES
    chaos = _chaos.run(lan, tmp_path)
    found = _chaos.problems(chaos)
    assert not found, "\n".join([*found, tails([lf.run for lf in chaos.lives])])
    report = _chaos.report(chaos)
    print(json.dumps(report, indent=2))  # the numbers: `pytest -s` shows them
    undetected = [k for k in report["kills"] if k["detect_s"] is None]
    assert not undetected, f"kills not detected by every survivor: {undetected}"
    assert len(chaos.kills) == 3
    _assert_checks_catch_mutations(chaos)


def _assert_checks_catch_mutations(chaos: _chaos.ChaosRun) -> None:
    """The run's checks are not vacuous: breaking the trace at a survivor is caught."""
    node = next(lf.index for lf in chaos.lives if lf.stayed_up and lf.node not in _chaos.PUBLISHERS)
    for mutate in (drop_last_delivery, duplicate_delivery, swap_same_source):
        broken = replace(chaos, trace=mutate(chaos.trace, node))
        assert _chaos.problems(broken), f"{mutate.__name__} at node {node} went unnoticed"


def test_restarted_publisher_is_a_source_of_its_own(tmp_path: Path) -> None:
    """Trace loading tells incarnations apart (a restart numbers from 0 again) and
    ends a killed life with ``crash``; an unknown incarnation is reported."""
    runs = {}
    for node, life, rows in (
        (0, 0, [_row("a", 1, "subscribe"), _row("a", 1, "publish", 0),
                _row("a", 1, "deliver", 0), _row("a", 2, "deliver", 0)]),
        (0, 1, [_row("a", 2, "subscribe"), _row("a", 2, "publish", 0),
                _row("a", 2, "deliver", 0), _row("a", 9, "deliver", 0)]),
    ):  # fmt: skip
        path = tmp_path / f"{node}.{life}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut sh')
        runs[life] = _chaos.Life(node, life, _life_run(path), killed=5.0 if life == 0 else None)
    events, problems = _chaos.load([runs[0], runs[1]])
    second = _chaos.NODES
    assert [(e.node, e.event, e.source, e.seq) for e in events] == [
        (0, "subscribe", None, None), (0, "publish", 0, 0), (0, "deliver", 0, 0),
        (0, "deliver", second, 0), (0, "crash", None, None),
        (second, "subscribe", None, None), (second, "publish", second, 0),
        (second, "deliver", second, 0),
    ]  # fmt: skip
    assert len(problems) == 1, problems
    assert "unknown incarnation" in problems[0]


def _row(node: str, inc: int, event: str, seq: int | None = None) -> dict[str, object]:
    return {"time": 1.0, "node": node, "event": event, "topic": "t", "source": node,
            "seq": seq, "inc": inc}  # fmt: skip


def _life_run(trace: Path) -> _chaos.NodeRun:
    return _chaos.NodeRun(0, "a", Path(), _chaos.Role("t"), trace=trace)

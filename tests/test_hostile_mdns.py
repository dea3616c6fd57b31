"""Junk in mDNS cannot stall discovery (issue 20, part), on real processes.

An outsider (``tests/_outsider.py flood``) announces 30 services of the
fleet's service type that never resolve, as an attacker or the stale cache
entries of powered-off devices would, before four ``p2p node`` processes
start on 127.0.0.1 with real mDNS.  Names resolve in parallel with a short
timeout, so every node finds the three others within 8 s, and every
publication is delivered (trace checks and completeness).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_membership_lan import HERE, _argv, _check, _service_type, _start, _wait
from test_system_netns import Plan, Role, make_fleet

pytestmark = pytest.mark.slow


def test_nodes_form_despite_a_flood_of_services_that_never_resolve(tmp_path: Path) -> None:
    count, rate, duration, settle = 40, 10.0, 25.0, 8.0
    nodes = make_fleet(tmp_path, [Role("chat")] * 4, psk=True)
    stype = _service_type()
    outsider = subprocess.Popen(
        [sys.executable, str(HERE / "_outsider.py"), "flood", "127.0.0.1", stype, "60", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert outsider.stdout is not None
        assert outsider.stdout.readline().strip() == "flooding", outsider.stderr
        time.sleep(2)  # the junk is in every cache before the nodes start
        procs = []
        for n in nodes:
            publishes = n.index < 2
            argv = _argv(
                n, "--service-type", stype, "--settle", str(settle),
                count=count if publishes else 0, rate=rate, duration=duration,
            )  # fmt: skip
            procs.append(_start(n, tmp_path, argv))
        _wait(nodes, procs, duration + 30)
    finally:
        outsider.kill()
        outsider.wait()
    for n in nodes:
        err = n.stderr.read_text(errors="replace")
        assert "3 peers found" in err, (
            f"node {n.index} did not find the others in {settle} s:\n{err}"
        )
    plan = Plan({"chat": frozenset({0, 1})}, {"chat": frozenset(range(4))}, count)
    _check(nodes, plan)

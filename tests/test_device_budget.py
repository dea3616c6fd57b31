"""The device budget (issue 44): ``p2p node --stats-every`` prints what a node
costs while it runs, and ``tools/device_budget.py`` reads it back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import P2P, free_port, make_fleet

from tools.device_budget import Sample, parse, steady


def test_p2p_node_prints_its_counters(tmp_path: Path) -> None:
    make_fleet(tmp_path, ["a"], psk=True)
    out = subprocess.run(
        [*P2P, "node", "--identity", str(tmp_path / "a"), "--no-mdns", "--seed",
         f"127.0.0.1:{free_port()}", "--publish", "t", "--count", "40", "--rate", "40",
         "--settle", "0", "--stats-every", "0.5", "--duration", "2.6", "--quiet"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    samples = parse(out.stderr)
    assert len(samples) >= 4, out.stderr
    assert all(s.rss_mb > 10 and s.threads >= 1 and s.sockets >= 1 for s in samples)
    assert samples[-1].published == 40
    assert samples[-1].delivered == 40  # its own publications
    assert [s.cpu_s for s in samples] == sorted(s.cpu_s for s in samples)


def test_stats_every_must_be_positive(tmp_path: Path) -> None:
    make_fleet(tmp_path, ["a"], psk=True)
    out = subprocess.run(
        [*P2P, "node", "--identity", str(tmp_path / "a"), "--stats-every", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip() == "p2p: error: --stats-every must be positive"


def test_steady_window() -> None:
    """Cost per message over 10 % .. 95 % of the messages, start-up excluded."""
    samples = [Sample(40.0, 4, 6, cpu, n, n) for cpu, n in
               [(0.5, 0), (0.6, 5), (0.7, 100), (0.8, 200), (0.9, 300), (1.2, 400)]]  # fmt: skip
    load = steady(samples, "published", 400, 1.0)
    assert load.messages == 300 - 100
    assert load.cpu_us_per_msg == pytest.approx(1e6 * 0.2 / 200)
    assert load.cpu_pct == pytest.approx(10.0)
    assert load.max_rss_mb == 40.0
    with pytest.raises(SystemExit, match="too few samples"):
        steady(samples[:2], "published", 400, 1.0)


@pytest.mark.slow
def test_the_tool_runs_quickly_and_says_what_it_measured(tmp_path: Path) -> None:
    """A reduced run (one rate, short): every number it reports is there."""
    out = subprocess.run(
        [sys.executable, "-m", "tools.device_budget", "--rates", "200", "--seconds", "3",
         "--every", "0.5", "--idle", "3", "--out", str(tmp_path / "b.json")],
        capture_output=True, text=True, timeout=120, check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "200 msg/s, subscriber: CPU per message" in out.stdout
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["build"] in ("pure", "mypyc")
    assert result["idle"]["threads"] >= 1
    assert result["rates"][0]["subscriber"]["messages"] > 0

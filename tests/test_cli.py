"""``p2p sim`` and ``p2p demo`` end to end, through ``main`` and as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _cli import sim_lines

from p2p.cli import main

FIG54 = Path(__file__).parent.parent / "p2p" / "sim" / "scenarios" / "fig54.txt"


def test_sim_writes_metrics_and_trace(tmp_path: Path) -> None:
    metrics, trace = tmp_path / "m.json", tmp_path / "t.jsonl"
    rc = main([
        "sim", str(FIG54), "--nodes", "8", "--rng-seed", "3",
        "--metrics", str(metrics), "--trace", str(trace), "--quiet",
    ])  # fmt: skip
    assert rc == 0
    m = json.loads(metrics.read_text())
    # Fig. 5.4: five subscribers, one publication -> 4 PUB packets, no relay.
    assert m["packets"]["PUB"] == 4
    assert m["packets"]["SUB"] == 5 * 7  # every SUB reaches the 7 other nodes
    assert m["packets"]["total"] == sum(m["packets"][k] for k in ("PUB", "SUB", "UNS", "ACK"))
    assert m["false_positives"] == 0
    for key in ("reception", "delivery"):
        assert set(m["latency"][key]) >= {"mean", "p50", "p99", "max"}
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    assert all(set(e) == {"time", "node", "event", "topic", "source", "seq"} for e in events)
    delivered = sorted(e["node"] for e in events if e["event"] == "deliver")
    assert delivered == [0, 2, 3, 5, 7]
    assert sum(e["event"] == "subscribed" for e in events) == 5
    times = [e["time"] for e in events]
    assert times == sorted(times)


def test_sim_is_deterministic_per_seed(tmp_path: Path) -> None:
    outs: list[str] = []
    for seed in (1, 1, 2):
        trace = tmp_path / f"t{len(outs)}.jsonl"
        main(
            [
                "sim",
                str(FIG54),
                "--nodes",
                "8",
                "--rng-seed",
                str(seed),
                "--trace",
                str(trace),
                "--quiet",
            ]
        )
        outs.append(trace.read_text())
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]


def test_srpt_has_extra_hop_and_relays(tmp_path: Path) -> None:
    metrics = tmp_path / "m.json"
    rc = main(
        [
            "sim",
            str(FIG54),
            "--nodes",
            "8",
            "--protocol",
            "srpt",
            "--metrics",
            str(metrics),
            "--quiet",
        ]
    )
    assert rc == 0
    m = json.loads(metrics.read_text())
    assert m["packets"]["PUB"] >= 4  # at least one copy per other subscriber
    assert m["deliveries"] == 5


def test_malformed_scenario_exits_2_with_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("0;SUB;0;t\n1;PUB;99;t;x\n")
    assert main(["sim", str(bad), "--nodes", "4"]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err
    assert "out of range" in err


def test_missing_scenario_and_bad_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", str(tmp_path / "nope.txt"), "--nodes", "4"]) == 2
    assert "cannot read scenario" in capsys.readouterr().err
    assert main(["sim", str(FIG54), "--nodes", "0"]) == 2


def test_refused_publication_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scen = tmp_path / "s.txt"
    scen.write_text("0;PUB;1;t;not subscribed\n")
    metrics = tmp_path / "m.json"
    assert main(["sim", str(scen), "--nodes", "2", "--metrics", str(metrics), "--quiet"]) == 0
    assert "refused" in capsys.readouterr().err
    assert json.loads(metrics.read_text())["refused"] == 1


def test_console_script_demo_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "p2p", "demo", "--nodes", "16", "--messages", "32"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "vcube-ps:" in proc.stdout
    assert "srpt:" in proc.stdout


def test_the_old_seed_flag_says_where_it_went(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", str(FIG54), "--nodes", "8", "--seed", "3", "--quiet"]) == 2
    assert "--seed is now --rng-seed 3" in capsys.readouterr().err
    assert main(["demo", "--seed", "1"]) == 2
    assert "--seed is now --rng-seed 1" in capsys.readouterr().err


def test_sim_reports_what_resets_and_second_starts_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``RESET`` and ``TWIN`` runs print and write their counters; others do not."""
    subs = "0;SUB;0;t\n0;SUB;1;t\n0;SUB;2;t\n500;PUB;0;t;hi\n"
    cases = {
        "links": (subs + "600;RESET;0;1\n600.5;PUB;0;t;a\n601;PUB;0;t;b\n", "resets", 1),
        "twins": (subs + "600;TWIN;1\n900;PUB;0;t;b\n", "superseded", 1),
        None: (subs + "600.5;PUB;0;t;a\n", None, 0),
    }
    for key, (text, counter, expected) in cases.items():
        doc, _ = sim_lines(tmp_path, text.splitlines(), 3, name=str(key))
        out = capsys.readouterr().out
        for other in ("links", "twins"):
            assert (other in doc) == (other == key), (key, sorted(doc))
            assert (f"{other}: " in out) == (other == key), out
        if key is not None:
            assert counter is not None
            assert doc[key][counter] == expected, doc[key]

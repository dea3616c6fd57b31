"""``p2p check TRACE...`` on simulated and real traces, clean and hand-corrupted (issue 21)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from p2p.cli import main
from p2p.sim import DelayModel, Simulation, legal_script
from p2p.sim._tracefile import load_traces

P2P = [sys.executable, "-m", "p2p"]
SCENARIO = """\
0;SUB;*;t
1000;PUB;1;t;a
1002;PUB;2;t;b
1300;PUB;1;t;c
500;CRASH;5
900;PUB;0;t;d
3000;RECOVER;5
3100;SUB;5;t
4000;PUB;5;t;e
4001;PUB;3;t;f
"""


@pytest.fixture
def sim_trace(tmp_path: Path) -> Path:
    (tmp_path / "s.txt").write_text(SCENARIO)
    trace = tmp_path / "trace.jsonl"
    args = ["sim", str(tmp_path / "s.txt"), "--nodes", "8", "--quiet", "--trace", str(trace)]
    assert main(args) == 0
    return trace


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def check(paths: list[Path], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["check", *map(str, paths)])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_clean_simulated_trace_passes(
    sim_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = check([sim_trace], capsys)
    assert code == 0, out
    assert "OK: no violations" in out
    assert "8 nodes, 6 publications" in out


def test_a_duplicated_delivery_is_flagged(
    sim_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = lines(sim_trace)
    i = next(k for k, r in enumerate(rows) if r["event"] == "deliver" and r["node"] == 3)
    rows.insert(i + 1, rows[i])
    code, out = check([write(tmp_path / "dup.jsonl", rows)], capsys)
    assert code == 1
    assert "[duplicate] node 3" in out
    assert f"delivered ({rows[i]['source']}, {rows[i]['seq']}) again" in out


def test_a_missing_delivery_is_flagged(
    sim_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = lines(sim_trace)
    gone = next(r for r in rows if r["event"] == "deliver" and r["node"] == 6 and r["source"] == 0)
    rows.remove(gone)
    code, out = check([write(tmp_path / "miss.jsonl", rows)], capsys)
    assert code == 1
    assert "[liveness] node 6 topic 't'" in out
    assert "never delivered (0, 1)" in out


def test_reordered_deliveries_are_flagged(
    sim_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Node 4 delivers 1's second publication before its first: FIFO and causal
    order (the first is in the second's past) both break."""
    rows = lines(sim_trace)
    mine = [k for k, r in enumerate(rows) if r["node"] == 4 and r["event"] == "deliver"]
    first = next(k for k in mine if rows[k]["source"] == 1 and rows[k]["seq"] == 1)
    second = next(k for k in mine if rows[k]["source"] == 1 and rows[k]["seq"] == 2)
    rows[first], rows[second] = rows[second], rows[first]
    for row in rows:  # keep node 4's clock monotone: only the order is corrupted
        if row["node"] == 4:
            row["time"] = 0.0 if str(row["event"]).startswith("subscribe") else 1.0
    code, out = check([write(tmp_path / "swap.jsonl", rows)], capsys)
    assert code == 1
    assert "[fifo] node 4 topic 't': delivered (1, 1) after (1, 2)" in out
    assert "[causal] node 4" in out


def test_a_per_node_split_checks_like_the_whole(
    sim_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real runs give one file per node, in any order on the command line."""
    rows = lines(sim_trace)
    paths = [write(tmp_path / f"n{n}.jsonl", [r for r in rows if r["node"] == n]) for n in range(8)]
    code, out = check(paths[::-1], capsys)
    assert code == 0, out
    assert "8 file(s)" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json\n", "trace.jsonl:1: Expecting value"),
        ('{"time": 1, "node": 0, "event": "teleport", "topic": "t"}\n', "unknown event"),
        ('{"time": "x", "node": 0, "event": "deliver", "topic": "t"}\n', "time must be"),
        ('{"time": 1, "node": "zz", "event": "subscribe", "topic": "t"}\n', "hex id"),
        ('{"time": 1, "node": 0, "event": "deliver", "topic": "t", "seq": 1}\n', "needs source"),
        ("[1, 2]\n", "not a JSON object"),
    ],
)
def test_unreadable_input_exits_2_with_one_line(
    tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(content)
    code, out = check([path], capsys)
    assert code == 2
    assert message in out
    assert len(out.strip().splitlines()) == 1
    assert "Traceback" not in out


def test_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check([tmp_path / "nope.jsonl"], capsys)
    assert code == 2
    assert "cannot open" in out


def test_traces_without_events_exit_2_rather_than_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every check holds on nothing: an empty trace (a node run without
    ``--trace``, a wrong path) must not read as a verified run."""
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for path in paths:
        path.write_text("\n")
    code, out = check(paths, capsys)
    assert code == 2
    assert "no events" in out
    assert "OK" not in out


def test_a_new_incarnation_in_a_real_trace_is_a_restart(tmp_path: Path) -> None:
    """``p2p node`` traces name nodes in hex and carry ``inc``: a node that comes
    back under a new incarnation starts afresh (subscribing again is legal)."""
    a, b = "00000000000000aa", "00000000000000bb"

    def row(
        t: float, node: str, event: str, src: str, seq: int | None, inc: int
    ) -> dict[str, object]:
        return {"time": t, "node": node, "event": event, "topic": "t", "source": src,
                "seq": seq, "inc": inc}  # fmt: skip

    rows = [
        row(1, a, "subscribe", a, None, 1), row(2, a, "subscribed", a, None, 1),
        row(1, b, "subscribe", b, None, 7), row(2, b, "subscribed", b, None, 7),
        row(3, a, "publish", a, 1, 1), row(3, a, "deliver", a, 1, 1),
        row(4, b, "deliver", a, 1, 1),
        row(9, a, "subscribe", a, None, 2), row(10, a, "subscribed", a, None, 2),
    ]  # fmt: skip
    loaded = load_traces([write(tmp_path / "x.jsonl", rows)])
    assert [e.event for e in loaded.events if e.node == 0][-4:] == [
        "crash", "recover", "subscribe", "subscribed",
    ]  # fmt: skip
    assert loaded.names == {0: a, 1: b}
    assert main(["check", str(tmp_path / "x.jsonl")]) == 0


def test_eighty_random_crash_recovery_scenarios_pass_the_trace_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21 "done when": the same checks, through the file format and CLI."""
    import random

    failed = []
    for seed in range(80):
        rng = random.Random(seed)
        n = rng.randint(3, 12)
        steps = [
            (float(rng.randrange(0, 5000)), rng.randrange(n), rng.choice(["t0", "t1"]),
             rng.randint(0, 9))
            for _ in range(rng.randint(2 * n, 5 * n))
        ]  # fmt: skip
        script = legal_script(steps, crash_roll=9, max_down=n // 2, recover=True)
        sim = Simulation(list(range(n)), seed=seed, delays=DelayModel(tpp_stdev=60))
        for at, action, node, topic in script:
            sim.schedule(at, action, node, topic, b"x")
        sim.run()
        path = tmp_path / f"{seed}.jsonl"
        with path.open("w") as fh:
            sim.recorder.write_trace(fh)
        if main(["check", str(path)]) != 0:
            failed.append(seed)
    out = capsys.readouterr().out
    assert failed == [], out
    assert out.count("OK: no violations") == 80


# ------------------------------------------------------------ real nodes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_traces_of_a_real_four_node_run_pass_and_a_cut_one_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four ``p2p node`` processes on 127.0.0.1 (peer exchange, no mDNS): two
    subscribe at once, two publish 5 each once subscribed (``--settle`` 3 s), so
    every subscriber owes all 10.  The traces pass; without one delivery they fail."""
    assert main(["fleet", "init", str(tmp_path / "fleet")]) == 0
    for name in "abcd":
        assert main(["fleet", "add-node", str(tmp_path / "fleet"), str(tmp_path / name)]) == 0
    port = _free_port()
    common = ["--interface", "127.0.0.1", "--no-mdns", "--seed", f"127.0.0.1:{port}",
              "--duration", "9", "--quiet"]  # fmt: skip
    roles = {
        "a": ["--port", str(port), "--subscribe", "t", "--settle", "1"],
        "b": ["--subscribe", "t", "--settle", "1"],
        "c": ["--publish", "t", "--count", "5", "--rate", "10", "--settle", "3"],
        "d": ["--publish", "t", "--count", "5", "--rate", "10", "--settle", "3"],
    }
    procs = []
    try:
        for name, role in roles.items():
            procs.append(
                subprocess.Popen(
                    [
                        *P2P,
                        "node",
                        "--identity",
                        str(tmp_path / name),
                        *common,
                        *role,
                        "--trace",
                        str(tmp_path / f"{name}.jsonl"),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    traces = [tmp_path / f"{name}.jsonl" for name in roles]
    code, out = check(traces, capsys)
    assert code == 0, (out, outs)
    subscriber = lines(traces[1])
    assert sum(1 for r in subscriber if r["event"] == "deliver") == 10, outs
    cut = [r for r in subscriber if not (r["event"] == "deliver" and r["seq"] == 3)]
    assert len(cut) < len(subscriber)
    write(traces[1], cut)
    code, out = check(traces, capsys)
    assert code == 1
    assert "[liveness]" in out
    assert "nodes (also as message sources):" in out

"""The simulator's delay model (thesis §4.5.1) and event ordering."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from p2p import P2PError, ScenarioError
from p2p.sim import DelayModel, Simulation
from topics import Event, Received, Subscribed


def fixed(tpp: float = 100.0) -> DelayModel:
    return DelayModel(tpc=1.0, tt=1.0, tpp_mean=tpp, tpp_stdev=0.0)


def receptions(sim: Simulation) -> dict[int, float]:
    got: dict[int, float] = {}

    def listen(_: Simulation, node: int, time: float, event: Event) -> None:
        if isinstance(event, Received):
            got[node] = time

    sim.listeners.append(listen)
    return got


def test_one_hop_costs_tpc_tt_tpp_tpc() -> None:
    sim = Simulation([0, 1], delays=fixed())
    sim.preset_subscriptions("t", [0, 1])
    got = receptions(sim)
    sim.schedule(10, "PUB", 0, "t", b"x")
    sim.run()
    # publish processed at 10 (+t_pc), queued, transmitted (t_t), propagated
    # (t_pp), processed at the receiver (t_pc).
    assert got == {1: 10 + 1 + 1 + 100 + 1}


def test_sending_queue_serialises_copies() -> None:
    """No network broadcast: k children cost k transmissions, one after another."""
    sim = Simulation(list(range(8)), delays=fixed())
    sim.preset_subscriptions("t", range(8))
    got = receptions(sim)
    sim.schedule(0, "PUB", 0, "t", b"x")
    sim.run()
    # Node 0 sends to its children 1, 2, 4 in cluster order: departures 2, 3, 4.
    assert got[1] == pytest.approx(2 + 100 + 1)
    assert got[2] == pytest.approx(3 + 100 + 1)
    assert got[4] == pytest.approx(4 + 100 + 1)
    # 4 forwards to 5 then 6; 6 forwards to 7.
    assert got[5] == pytest.approx(got[4] + 1 + 100 + 1)
    assert got[6] == pytest.approx(got[4] + 2 + 100 + 1)
    assert got[7] == pytest.approx(got[6] + 1 + 100 + 1)


def test_receiver_processes_one_input_at_a_time() -> None:
    """Two packets arriving together at node 0 are processed t_pc apart."""
    sim = Simulation([0, 1, 2], delays=fixed())
    sim.preset_subscriptions("t", [0, 1, 2])
    times: list[float] = []

    def listen(_: Simulation, node: int, time: float, event: Event) -> None:
        if isinstance(event, Received) and node == 0:
            times.append(time)

    sim.listeners.append(listen)
    sim.schedule(0, "PUB", 1, "t", b"a")
    sim.schedule(0, "PUB", 2, "t", b"b")
    sim.run()
    assert len(times) == 2
    assert times[1] - times[0] == pytest.approx(1.0)


def test_events_at_equal_times_run_in_schedule_order() -> None:
    sim = Simulation([0, 1], delays=fixed())
    order: list[int] = []

    def listen(_: Simulation, node: int, time: float, event: Event) -> None:
        if isinstance(event, Subscribed):
            order.append(node)

    sim.listeners.append(listen)
    sim.schedule(5, "SUB", 1, "t")
    sim.schedule(5, "SUB", 0, "t")
    sim.run()
    first_calls = [e.node for e in sim.recorder.trace if e.event == "subscribe"]
    assert first_calls == [1, 0]
    assert sorted(order) == [0, 1]


def test_link_delay_override_and_determinism() -> None:
    def slow_direct(src: int, dst: int, rng: random.Random) -> float:
        return 500.0 if {src, dst} == {0, 1} else 1.0 + rng.random()

    def run(seed: int) -> list[tuple[float, int, str]]:
        sim = Simulation([0, 1, 2, 3], seed=seed, link_delay=slow_direct)
        for n in range(4):
            sim.schedule(0, "SUB", n, "t")
        sim.schedule(5000, "PUB", 0, "t", b"x")
        sim.run()
        assert sim.quiescent()
        return [(e.time, e.node, e.event) for e in sim.recorder.trace]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_propagation_never_negative() -> None:
    model = DelayModel(tpp_mean=1.0, tpp_stdev=50.0)
    rng = random.Random(0)
    assert min(model.propagation(rng) for _ in range(2000)) >= 0.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        DelayModel(tt=-1)
    for bad in (float("nan"), float("inf"), -0.5):
        with pytest.raises(ScenarioError, match="tpp_mean must be a finite non-negative"):
            DelayModel(tpp_mean=bad)
    with pytest.raises(P2PError, match="unknown protocol"):
        Simulation([0], protocol="gossip")
    with pytest.raises(P2PError, match="distinct"):
        Simulation([1, 1])
    sim = Simulation([0, 1])
    with pytest.raises(P2PError, match="unknown node"):
        sim.schedule(0, "PUB", 7, "t")
    with pytest.raises(P2PError, match="unknown action"):
        sim.schedule(0, "JOIN", 0, "t")
    # Refused when scheduled, not when run: a NaN time disordered the event
    # heap, and a str payload failed deep inside the run.
    for when in (float("nan"), float("inf")):
        with pytest.raises(P2PError, match="time must be a finite number"):
            sim.schedule(when, "SUB", 0, "t")
    with pytest.raises(P2PError, match="SUB needs a topic"):
        sim.schedule(0, "SUB", 0, "")
    with pytest.raises(P2PError, match="PUB payload must be bytes, got str"):
        sim.schedule(0, "PUB", 0, "t", "x")  # type: ignore[arg-type]
    with pytest.raises(P2PError, match="detect_delay and detect_jitter must be finite"):
        Simulation([0, 1], detect_delay=float("nan"))
    assert sim.run() == 0  # nothing was scheduled by the refused calls


def test_round_messages_1_is_the_thesis_stop_and_wait(tmp_path: Path) -> None:
    """Issue 21: ``--round-messages 1`` gives the thesis' counts on a bursty script
    (one PUB and one ACK per tree edge per publication); the default batches."""
    from p2p.cli import main

    scenario = Path(__file__).parents[1] / "p2p" / "sim" / "scenarios" / "burst.txt"
    counts = {}
    for k in (1, 256):
        out = tmp_path / f"m{k}.json"
        args = ["sim", str(scenario), "--nodes", "64", "--oracle-subscriptions", "--quiet"]
        assert main([*args, "--round-messages", str(k), "--metrics", str(out)]) == 0
        counts[k] = json.loads(out.read_text())["packets"]
    assert counts[1]["PUB"] == counts[1]["ACK"] == 160 * 63
    assert (
        counts[256]["PUB"] == counts[256]["ACK"] == 8 * 2 * 63
    )  # per burst: the first alone, then 19
    assert main([*args, "--round-messages", "0"]) == 2

"""Gap events: a publication a subscriber will not get is counted, never silent.

Checked here: the envelope's arithmetic (``p2p.machine._frontier``); that a
publication the core refuses takes no ordinal; that the frontier survives
the node's own reincarnation; in the simulator, the healed partition of
``tests/test_partition.py``, where every subscriber's deliveries plus its
reported gaps account for every publication exactly; that the trace checks
flag a gap counting more than was missed; that ``p2p check`` reads ``gap``
lines; and, on real nodes, that a subscriber back as a new incarnation gets
``Delivery.missed`` and a ``gap`` trace line.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from test_partition import COUNT, _deaf_fleet

from p2p.machine import ENVELOPE_SIZE, SKIP, Frontier, envelope_of
from p2p.sim import DETECTOR, Simulation, TraceChecker, TraceEvent, check_trace
from p2p.sim._tracefile import load_traces
from topics import NotSubscribedError


def _pub(frontier: Frontier, topic: str, body: bytes = b"x") -> bytes:
    payload = frontier.envelope(topic) + body
    frontier.published(topic)
    return payload


def test_ordinals_count_per_topic_and_gaps_are_exact() -> None:
    pub, sub = Frontier(epoch=7), Frontier(epoch=1)
    a = [_pub(pub, "a") for _ in range(6)]
    b = _pub(pub, "b")
    assert [envelope_of(p) for p in a[:2]] == [(7, 0), (7, 1)]
    assert envelope_of(b) == (7, 0)
    assert len(b) == ENVELOPE_SIZE + 1
    assert sub.delivered("a", 9, a[1]) == 0  # the first: nothing owed before it
    assert sub.delivered("a", 9, a[2]) == 0
    assert sub.delivered("a", 9, a[5]) == 2  # 3 and 4 will not come
    assert sub.delivered("a", 9, a[4]) == SKIP  # late: already counted, not delivered again
    assert sub.delivered("b", 9, b) == 0  # another topic, its own numbering
    assert sub.missed == 2


def test_a_restarted_source_starts_a_new_numbering() -> None:
    old, sub = Frontier(epoch=3), Frontier(epoch=1)
    first = [_pub(old, "t") for _ in range(10)]
    new = Frontier(epoch=5)  # the same id, a new process
    second = [_pub(new, "t") for _ in range(4)]
    assert sub.delivered("t", 2, first[8]) == 0
    assert sub.delivered("t", 2, second[3]) == 3  # the new process's 0..2
    # The older process's last, late (the core held it for its causal past):
    # handed on once, counting nothing; anything at or behind what was delivered
    # of that process stays out.
    assert sub.delivered("t", 2, first[9]) == 0
    assert sub.delivered("t", 2, first[9]) == SKIP
    assert sub.delivered("t", 2, first[7]) == SKIP
    assert sub.delivered("t", 2, second[2]) == SKIP
    sub.forget("t")
    assert sub.delivered("t", 2, second[3]) == 0  # a new subscription owes nothing


def test_a_refused_publication_takes_no_ordinal() -> None:
    sim = Simulation([1, 2], seed=1, detector=DETECTOR)
    machine = sim.machines[1]
    with pytest.raises(NotSubscribedError):
        machine.publish("t", b"x", 0.0)
    assert machine.frontier.envelope("t") == Frontier(machine.frontier.epoch).envelope("t")


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("small", [(0, 1), (2, 3, 4)], ids=["publisher-small", "publisher-large"])
def test_a_healed_partition_loses_no_publication(seed: int, small: tuple[int, ...]) -> None:
    """Every subscriber, on either side, delivers each of the publisher's
    :data:`COUNT` publications exactly once: what it did not get while the
    sides were apart it resumes from the publisher's history (1,000 kept,
    the split makes 500), and no gap is counted."""
    sim = _deaf_fleet(seed, small)
    sim.run()
    trace = sim.recorder.trace
    assert check_trace(trace, quiescent=True) == []
    got = Counter(e.node for e in trace if e.event == "deliver" and e.source == 0)
    missed: Counter[int] = Counter()
    for e in trace:
        if e.event == "gap" and e.source == 0:
            assert e.seq is not None
            missed[e.node] += e.seq
    assert {n: got[n] for n in range(1, 6)} == dict.fromkeys(range(1, 6), COUNT), missed
    assert not missed
    recovered = sum(m.recovery.stats["recovered"] for m in sim.machines.values())
    assert recovered > 3 * 400  # the cut-off side's 25 s came from the history


def test_without_a_history_a_healed_partition_counts_what_it_lost() -> None:
    """``history.count = 0``: the subscribers cut off from the publisher
    deliver or are told they missed each publication, exactly once."""
    sim = _deaf_fleet(1, (2, 3, 4), keep=0)
    sim.run()
    trace = sim.recorder.trace
    assert check_trace(trace, quiescent=True) == []
    got = Counter(e.node for e in trace if e.event == "deliver" and e.source == 0)
    missed: Counter[int] = Counter()
    for e in trace:
        if e.event == "gap" and e.source == 0:
            assert e.seq is not None
            missed[e.node] += e.seq
    assert {n: got[n] + missed[n] for n in range(1, 6)} == dict.fromkeys(range(1, 6), COUNT)
    assert all(missed[n] > 400 for n in (2, 3, 4)), missed  # the 25 s the sides were apart


def test_the_checks_flag_a_gap_that_counts_more_than_was_missed() -> None:
    checker = TraceChecker()
    checker.feed(
        [
            TraceEvent(0.0, 0, "subscribe", "t", 0, None),
            TraceEvent(0.0, 1, "subscribe", "t", 1, None),
            TraceEvent(1.0, 0, "publish", "t", 0, 0),
            TraceEvent(2.0, 0, "publish", "t", 0, 1),
            TraceEvent(3.0, 1, "deliver", "t", 0, 0),
            TraceEvent(4.0, 1, "gap", "t", 0, 2),
        ]
    )
    found = [v for v in checker.violations() if v.kind == "gap"]
    assert len(found) == 1, found
    assert "only 1 not delivered" in found[0].detail


def test_p2p_check_reads_gap_lines(tmp_path: Path) -> None:
    a, b = "00000000000000a1", "00000000000000b2"
    rows = [
        {"time": 0.0, "node": a, "event": "subscribe", "topic": "t", "source": None,
         "seq": None, "inc": 1},
        {"time": 0.5, "node": a, "event": "publish", "topic": "t", "source": a, "seq": 0, "inc": 1},
        {"time": 0.6, "node": a, "event": "publish", "topic": "t", "source": a, "seq": 1, "inc": 1},
        {"time": 0.0, "node": b, "event": "subscribe", "topic": "t", "source": None,
         "seq": None, "inc": 4},
        {"time": 1.0, "node": b, "event": "gap", "topic": "t", "source": a, "seq": 1, "inc": 1},
        {"time": 1.0, "node": b, "event": "deliver", "topic": "t", "source": a, "seq": 1, "inc": 1},
    ]  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_traces([path])
    gaps = [e for e in loaded.events if e.event == "gap"]
    assert len(gaps) == 1
    assert gaps[0].seq == 1
    assert [e.event for e in loaded.events].count("crash") == 0  # a gap's inc is its source's
    assert check_trace(loaded.events) == []


def test_the_frontier_store_keeps_the_newest_valid_write(tmp_path: Path) -> None:
    from p2p.runtime._frontier_file import MAX_FRONTIER_BYTES, FrontierFileError, FrontierStore

    path = tmp_path / "frontier"
    assert FrontierStore(path).load() == {}  # none yet: start from nothing
    store = FrontierStore(path)
    states = [{"t": {1 << 63: (5, n), 7: (0, 0)}, "u": {}} for n in range(3)]
    for state in states:
        store.write(state)
    store.sync()
    store.close()
    assert FrontierStore(path).load() == states[2]
    newest = store.paths[0]  # writes alternate: .0, .1, .0
    data = newest.read_bytes()
    newest.write_bytes(data[:-3] + b"\x00\x00\x00")  # torn by a power loss
    assert FrontierStore(path).load() == states[1]  # the other one
    again = FrontierStore(path)
    again.load()
    again.write(states[0])  # never over the newest valid one
    again.close()
    assert FrontierStore(path).load() == states[0]
    for junk in (b"", b"\xff\x00junk", b"P2FR" + bytes(16)):
        for p in store.paths:
            p.write_bytes(junk)
        with pytest.raises(FrontierFileError):
            FrontierStore(path).load()
    store.paths[0].write_bytes(b"\x00" * (MAX_FRONTIER_BYTES + 1))
    with pytest.raises(FrontierFileError, match="at most"):
        FrontierStore(path).load()


def _restart_run(tmp_path: Path, history: int) -> list[tuple[bytes, int]]:
    """Real nodes on loopback: the subscriber stops (cleanly), 10 publications
    are made while it is down, it comes back with the same directory, and 10
    more are made; what it delivered, with each delivery's ``missed``."""
    import trio

    from p2p.fleet import add_node, init_fleet
    from p2p.runtime import NodeConfig, open_node

    init_fleet(tmp_path / "f", psk=True)
    pub_dir, sub_dir = tmp_path / "pub", tmp_path / "sub"
    add_node(tmp_path / "f", pub_dir, name="pub")
    add_node(tmp_path / "f", sub_dir, name="sub")
    got: list[tuple[bytes, int]] = []
    want = 30 if history else 20

    async def subscriber(seed: str, count: int) -> None:
        cfg = NodeConfig(discovery=False, seeds=(seed,))
        async with open_node(sub_dir, cfg) as sub:
            subscription = await sub.subscribe("t")
            with trio.fail_after(20):
                async for d in subscription:
                    got.append((d.payload, d.missed))
                    if len(got) == count:
                        return

    async def publish(node, first: int, n: int) -> None:  # type: ignore[no-untyped-def]
        for i in range(first, first + n):
            await node.publish("t", b"m%d" % i, wait_acked=True)

    async def main() -> None:
        cfg = NodeConfig(discovery=False, history_count=history)
        async with open_node(pub_dir, cfg) as pub:
            await pub.subscribe("t")
            seed = f"127.0.0.1:{pub.port}"
            for first, stop in ((0, 10), (20, want)):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(subscriber, seed, stop)
                    with trio.fail_after(20):
                        while len(pub.core.view("t")) < 2:
                            await trio.sleep(0.05)
                    await publish(pub, first, 10)
                if first == 0:  # down: the subscriber's LEAVE has reached the publisher
                    with trio.fail_after(20):
                        while len(pub.core.view("t")) > 1:
                            await trio.sleep(0.05)
                    await publish(pub, 10, 10)

    trio.run(main)
    assert load_frontier_count(sub_dir) == 1
    return got


def test_a_restarted_subscriber_resumes_what_it_missed(tmp_path: Path) -> None:
    """With the publisher's history covering the 10 made while the subscriber was
    down, it delivers all 30, in order, once each, and misses nothing."""
    got = _restart_run(tmp_path, history=1000)
    assert [p for p, _ in got] == [b"m%d" % i for i in range(30)]
    assert [m for _, m in got] == [0] * 30


def test_a_restarted_subscriber_is_told_what_the_history_lost(tmp_path: Path) -> None:
    """With no history kept, the first delivery after the restart says it missed
    exactly 10."""
    got = _restart_run(tmp_path, history=0)
    assert [p for p, _ in got] == [b"m%d" % i for i in (*range(10), *range(20, 30))]
    assert [m for _, m in got] == [0] * 10 + [10] + [0] * 9


def load_frontier_count(node_dir: Path) -> int:
    from p2p.runtime._frontier_file import FrontierStore

    return len(FrontierStore(node_dir / "frontier").load()["t"])


def test_a_corrupt_frontier_file_costs_one_line_not_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import trio

    from p2p.fleet import add_node, init_fleet
    from p2p.runtime import NodeConfig, open_node

    init_fleet(tmp_path / "f", psk=True)
    add_node(tmp_path / "f", tmp_path / "n", name="n")
    (tmp_path / "n" / "frontier.0").write_bytes(b"\xa1junk")

    async def main() -> None:
        async with open_node(tmp_path / "n", NodeConfig(discovery=False)) as node:
            await node.subscribe("t")

    trio.run(main)
    lines = [r.getMessage() for r in caplog.records if "frontier" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "not counted" in lines[0]


def test_p2p_sub_prints_the_gap() -> None:
    from p2p.cli._nodecli import _format
    from p2p.runtime import Delivery

    d = Delivery("t", 0xAB, 1, 7, b"hi", False, 0.0, 3)
    assert json.loads(_format(d, True)) == {
        "topic": "t", "source": "00000000000000ab", "seq": 7, "payload": "hi", "missed": 3,
    }  # fmt: skip
    assert "missed" not in _format(Delivery("t", 0xAB, 1, 8, b"hi", False), True)


@pytest.mark.parametrize(("action", "resumed"), [("RESTART", True), ("RECOVER", False)])
def test_a_subscriber_restarted_with_its_state_resumes_in_the_simulator(
    action: str, resumed: bool
) -> None:
    """A subscriber crashes for 5 s while the publisher sends 20/s.  RESTART (its
    node directory kept) delivers every publication from its first delivery
    on, exactly once, the ones made while it was down included; RECOVER (a
    new, empty process) owes and delivers only what follows its new
    subscription."""
    ids = [0x51, 0x52, 0x53]
    sim = Simulation(ids, seed=4, detector=DETECTOR)
    for n in ids:
        sim.schedule(0.0, "SUB", n, "t")
    made = 200
    for j in range(made):
        sim.schedule(3000.0 + 50.0 * j, "PUB", ids[0], "t", b"m%d" % j)
    sim.schedule(5000.0, "CRASH", ids[2], "")
    sim.schedule(10_000.0, action, ids[2], "")
    sim.schedule(10_001.0, "SUB", ids[2], "t")
    sim.run()
    trace = sim.recorder.trace
    assert check_trace(trace, quiescent=True) == []
    got = [e.seq for e in trace if e.event == "deliver" and e.node == 2 and e.source == 0]
    assert len(got) == len(set(got)), "a publication twice across the restart"
    assert not [e for e in trace if e.event == "gap"]
    if resumed:
        made_seqs = [e.seq for e in trace if e.event == "publish" and e.node == 0]
        assert set(got) == set(made_seqs), "not every publication reached the subscriber"
    else:
        assert len(got) < made - 50  # the 5 s down: about 100 never came


def test_the_frontier_is_written_after_the_deliveries_it_records(tmp_path: Path) -> None:
    """Real nodes on loopback: when the subscriber hands a publication on (its
    trace's ``deliver``), the frontier file does not hold it yet, and it does
    once the step is over, so a process killed in between hands it on again
    after its restart and never skips it (``tests/test_restart_gap.py``)."""
    import trio
    from test_node import _fleet as node_fleet
    from test_node_failures import _until

    from p2p.runtime import NodeConfig, open_node
    from p2p.runtime._frontier_file import FRONTIER_FILE, FrontierStore

    a_dir, b_dir = node_fleet(tmp_path, 2)
    on_disk_at_delivery: list[int] = []

    def stored() -> int:
        """How many publications the subscriber's frontier file records (one
        source: its last ordinal + 1)."""
        frontiers = FrontierStore(b_dir / FRONTIER_FILE).load()
        return sum(o + 1 for per in frontiers.values() for _, o in per.values())

    def recorded(count: int) -> Callable[[], bool]:
        return lambda: stored() == count

    def trace(event: str, topic: str, source: int | None, seq: int | None, inc: int) -> None:
        if event == "deliver":
            on_disk_at_delivery.append(stored())

    async def main() -> None:
        quiet = NodeConfig(discovery=False, detector=False)
        async with open_node(a_dir, quiet) as a:
            cfg = NodeConfig(discovery=False, detector=False, seeds=(f"127.0.0.1:{a.port}",))
            async with open_node(b_dir, cfg, trace=trace) as b:
                await a.subscribe("t")
                sub = await b.subscribe("t")
                await _until(lambda: b.id in a.core.view("t"), 20, "a sees b")
                for k in range(4):
                    with trio.fail_after(10):
                        await a.publish("t", b"%d" % k, wait_acked=True)
                        await sub.receive()
                    await _until(recorded(k + 1), 5, f"publication {k} recorded")

    trio.run(main)
    # when publication k was handed on, the file recorded the k before it
    assert on_disk_at_delivery == [0, 1, 2, 3]

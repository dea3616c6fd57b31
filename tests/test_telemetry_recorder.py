"""Telemetry on the device: the spool (rotation, disk cap, crash leftovers) and live recording."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio
from _telemetry import read_records

from p2p import NodeConfig, open_node
from p2p._identity import add_node, init_fleet
from p2p.telemetry import bucket, iter_items
from p2p.telemetry._recorder import Recorder, Spool


def records(directory: Path) -> list[dict[str, Any]]:
    return read_records(sorted(directory.glob("*.cbor")))


def test_spool_rotates_caps_and_counts_what_it_drops(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=3000, file_bytes=1000)
    rec = Recorder(0xAB, spool, window=1.0)
    for i in range(40):
        rec.published("t")
        rec.delivered("t", latency_ms=2.0, holdback_ms=0.5 if i % 2 else 0.0)
        rec.flush(1.7e9 + i, {"packets_sent": i, "outbox_overflow": 0}, connections=1)
    spool.close()
    files = spool.complete()
    assert sum(f.stat().st_size for f in files) <= 3000
    assert spool.dropped > 0
    kept = records(tmp_path)
    seqs = [r["seq"] for r in kept]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # oldest dropped, rest contiguous
    assert seqs[0] == spool.dropped  # exactly the dropped records are missing
    drops = [r for r in kept if r["kind"] == "event" and r["event"] == "spool_dropped"]
    assert sum(int(r["detail"].split()[0]) for r in drops) <= spool.dropped
    for f in files:  # names say which records they hold
        _, first, last = f.stem.split("-")
        held = [r["seq"] for r in read_records([f])]
        assert held == list(range(int(first), int(last) + 1))


def test_node_and_topic_records_carry_window_deltas(tmp_path: Path) -> None:
    rec = Recorder(0xAB, Spool(tmp_path), window=10.0)
    rec.published("a")
    rec.delivered("a", latency_ms=3.0, holdback_ms=0.0)
    rec.delivered("a", latency_ms=40.0, holdback_ms=12.0)
    rec.acked_since("a", 100.025, [100.0, None])  # 25 ms; an untimed one is not counted
    rec.flush(1.7e9, {"packets_sent": 10, "bytes_sent": 500, "lost_on_disconnect": 1}, 2)
    rec.flush(1.7e9 + 10, {"packets_sent": 15, "bytes_sent": 900, "lost_on_disconnect": 1}, 2)
    rec.spool.close()
    got = records(tmp_path)
    nodes = [r for r in got if r["kind"] == "node"]
    assert [(n["packets_sent"], n["bytes_sent"], n["dropped"]) for n in nodes] == [
        (10, 500, 1),
        (5, 400, 0),
    ]
    (topic,) = [r for r in got if r["kind"] == "topic"]  # no activity: no record in window 2
    assert (topic["publications"], topic["deliveries"], topic["held"]) == (1, 2, 1)
    assert sum(topic["latency"]) == 2
    assert sum(topic["holdback"]) == 1
    assert sum(topic["ack_round"]) == 1
    assert topic["ack_round"][bucket(25.0)] == 1


def test_a_crash_leftover_becomes_a_complete_file_and_boot_advances(tmp_path: Path) -> None:
    first = Spool(tmp_path)
    rec = Recorder(0xAB, first, window=1.0)
    for i in range(3):
        rec.flush(1.7e9 + i, {}, 0)
    part = next(tmp_path.glob("*.part"))
    with part.open("ab") as fh:
        fh.write(b"\xa9\x61v")  # a record cut short by a power loss
    second = Spool(tmp_path)  # the device restarts
    assert second.boot == first.boot + 1
    (done,) = second.complete()
    assert done.name == f"{first.boot:08d}-{0:012d}-{2:012d}.cbor"
    items = list(iter_items(done.read_bytes()))
    assert [i for i, e in items if e is None] == [i for i, e in items[:3]]
    assert items[-1][1] is not None  # the cut record is left for the job to quarantine


def test_live_nodes_record_publications_deliveries_and_ack_rounds(tmp_path: Path) -> None:
    init_fleet(tmp_path / "fleet", psk=True)
    for name in ("a", "b"):
        add_node(tmp_path / "fleet", tmp_path / name)

    async def main() -> None:
        cfg_a = NodeConfig(
            discovery=False, telemetry_dir=tmp_path / "spool-a", telemetry_window=0.2
        )
        async with open_node(tmp_path / "a", cfg_a) as a:
            cfg_b = NodeConfig(
                discovery=False,
                seeds=(f"127.0.0.1:{a.port}",),
                telemetry_dir=tmp_path / "spool-b",
                telemetry_window=0.2,
            )
            async with open_node(tmp_path / "b", cfg_b) as b:
                with trio.fail_after(20):
                    while len(a.members()) < 2 or len(b.members()) < 2:
                        await trio.sleep(0.02)
                sub_a = await a.subscribe("room")
                await b.subscribe("room")
                for i in range(5):
                    await b.publish("room", b"%d" % i, wait_acked=True)
                got = [await sub_a.receive() for _ in range(5)]
                assert [d.payload for d in got] == [b"%d" % i for i in range(5)]
                assert all(abs(d.published_at - time.time()) < 60 for d in got)
                await trio.sleep(0.5)

    trio.run(main)
    rec_a, rec_b = records(tmp_path / "spool-a"), records(tmp_path / "spool-b")
    for recs in (rec_a, rec_b):
        events = [r["event"] for r in recs if r["kind"] == "event"]
        assert events[0] == "start"
        assert events[-1] == "stop"
        assert len({r["id"] for r in recs}) == len(recs)
    topic_a = [r for r in rec_a if r["kind"] == "topic" and r["topic"] == "room"]
    topic_b = [r for r in rec_b if r["kind"] == "topic" and r["topic"] == "room"]
    assert sum(r["deliveries"] for r in topic_a) == 5
    assert sum(sum(r["latency"]) for r in topic_a) == 5
    assert sum(r["publications"] for r in topic_b) == 5
    assert sum(sum(r["ack_round"]) for r in topic_b) == 5
    sent = sum(r["packets_sent"] for r in rec_b if r["kind"] == "node")
    assert sent >= 5
    assert max(r["rss_bytes"] for r in rec_a if r["kind"] == "node") > 1 << 20

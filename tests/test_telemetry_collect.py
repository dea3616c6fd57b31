"""Collection: real nodes spool telemetry and upload it to a collector; resume and idempotency."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import trio
from _telemetry import landed

from p2p import Node, NodeConfig, open_node
from p2p._identity import add_node, init_fleet, load_node
from p2p._transport import dial_secure
from p2p.telemetry._collector import (
    Collector,
    UploadStats,
    _Channel,
    run_collector,
    upload_spool,
)
from p2p.telemetry._recorder import Recorder, Spool


def _fleet(tmp_path: Path, names: list[str]) -> None:
    init_fleet(tmp_path / "fleet", psk=False)
    for name in names:
        add_node(tmp_path / "fleet", tmp_path / name)


def snapshot(landing: Path) -> dict[str, bytes]:
    return {str(f.relative_to(landing)): f.read_bytes() for f in landing.glob("date=*/*/*")}


def test_nodes_upload_their_spools_to_a_collector(tmp_path: Path) -> None:
    _fleet(tmp_path, ["collector", "a", "b"])
    landing = tmp_path / "landing"

    async def main() -> None:
        ident, fleet = load_node(tmp_path / "collector")
        async with trio.open_nursery() as nursery:
            collector: Collector = await nursery.start(run_collector, ident, fleet, landing)
            where = f"127.0.0.1:{collector.port}"

            def cfg(name: str, seeds: tuple[str, ...] = ()) -> NodeConfig:
                return NodeConfig(
                    discovery=False,
                    seeds=seeds,
                    telemetry_window=0.2,
                    telemetry_dir=tmp_path / f"spool-{name}",
                    telemetry_collector=where,
                    telemetry_upload_interval=0.3,
                )

            async with open_node(tmp_path / "a", cfg("a")) as a:  # noqa: SIM117 - b needs a.port
                async with open_node(tmp_path / "b", cfg("b", (f"127.0.0.1:{a.port}",))) as b:
                    await _exercise(a, b)
            assert collector.stats.files_landed >= 2
            nursery.cancel_scope.cancel()

    trio.run(main)
    recs = landed(landing)
    assert not list((tmp_path / "spool-a").glob("*.cbor"))  # everything uploaded, then deleted
    assert not list((tmp_path / "spool-b").glob("*.cbor"))
    by_device: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_device.setdefault(r["device"], []).append(r)
    assert len(by_device) == 2
    for dev_recs in by_device.values():
        seqs = sorted(r["seq"] for r in dev_recs)
        assert seqs == list(range(len(seqs)))  # nothing lost, nothing twice
        assert [r["event"] for r in dev_recs if r["kind"] == "event"] == ["start", "stop"]
    topics = [r for r in recs if r["kind"] == "topic"]
    assert sum(r["publications"] for r in topics) == 10
    assert sum(r["deliveries"] for r in topics) == 10  # a delivers b's ten


async def _exercise(a: Node, b: Node) -> None:
    with trio.fail_after(20):
        while len(a.members()) < 2 or len(b.members()) < 2:
            await trio.sleep(0.02)
    sub = await a.subscribe("room")
    await b.subscribe("room")
    for i in range(10):
        await b.publish("room", b"%d" % i, wait_acked=True)
    for _ in range(10):
        await sub.receive()
    await trio.sleep(1.0)  # a few upload rounds while running


def _spool_with_records(tmp_path: Path, device: int, n: int) -> Spool:
    spool = Spool(tmp_path / "spool", file_bytes=1 << 20)
    rec = Recorder(device, spool, window=1.0)
    for i in range(n):
        rec.published("t")
        rec.flush(1.7e9 + i * 3600, {}, 0)  # hourly windows: the records span two UTC days
    spool.rotate()
    return spool


def test_upload_resumes_after_interruption_and_never_duplicates(tmp_path: Path) -> None:
    _fleet(tmp_path, ["collector", "dev"])
    dev_id, dev_fleet = load_node(tmp_path / "dev")
    spool = _spool_with_records(tmp_path, dev_id.node_id, 30)
    (path,) = spool.complete()
    data = path.read_bytes()
    landing = tmp_path / "landing"

    async def main() -> None:
        ident, fleet = load_node(tmp_path / "collector")
        async with trio.open_nursery() as nursery:
            collector: Collector = await nursery.start(run_collector, ident, fleet, landing)
            # 1. An upload cut off after the first 1000 bytes.
            stream, session, messages = await dial_secure(
                "127.0.0.1", collector.port, dev_id, dev_fleet, 10
            )
            channel = _Channel(stream, session, messages)
            await channel.send("offer", path.name, len(data))
            assert (await channel.expect("resume", 2))[1] == 0
            await channel.send("chunk", data[:1000])
            await trio.sleep(0.2)
            await stream.aclose()
            await trio.sleep(0.2)
            part = landing / "_incoming" / f"{dev_id.node_id:016x}" / (path.name + ".part")
            assert part.read_bytes() == data[:1000]
            # 2. The device retries: the collector resumes at byte 1000.
            stats = UploadStats()
            await upload_spool(dev_id, dev_fleet, spool, f"127.0.0.1:{collector.port}", stats)
            assert stats.bytes_sent == len(data) - 1000
            assert not path.exists()
            first = snapshot(landing)
            # 3. A device restart re-sends the same file (e.g. the ack was lost): no duplicate.
            path.write_bytes(data)
            await upload_spool(dev_id, dev_fleet, spool, f"127.0.0.1:{collector.port}", stats)
            assert collector.stats.files_skipped == 1
            # 4. A collector that lost its ledger lands it again: identical files.
            for ledger in landing.glob("_incoming/*/landed.txt"):
                ledger.unlink()
            path.write_bytes(data)
            await upload_spool(dev_id, dev_fleet, spool, f"127.0.0.1:{collector.port}", stats)
            assert snapshot(landing) == first
            nursery.cancel_scope.cancel()

    trio.run(main)
    recs = landed(landing)
    assert sorted(r["seq"] for r in recs) == list(range(len(recs)))
    days = {dt.datetime.fromtimestamp(r["t"], dt.UTC).date().isoformat() for r in recs}
    assert len(days) >= 2
    assert {f.split("/")[0] for f in snapshot(landing)} == {f"date={d}" for d in days}
    assert len(recs) == 60  # 30 node + 30 topic records, each exactly once


def test_a_device_cannot_upload_another_devices_records(tmp_path: Path) -> None:
    _fleet(tmp_path, ["collector", "dev", "other"])
    dev_id, dev_fleet = load_node(tmp_path / "dev")
    other, _ = load_node(tmp_path / "other")
    spool = _spool_with_records(tmp_path, other.node_id, 3)  # records naming "other"
    landing = tmp_path / "landing"

    async def main() -> None:
        ident, fleet = load_node(tmp_path / "collector")
        async with trio.open_nursery() as nursery:
            collector: Collector = await nursery.start(run_collector, ident, fleet, landing)
            await upload_spool(
                dev_id, dev_fleet, spool, f"127.0.0.1:{collector.port}", UploadStats()
            )
            assert collector.stats.foreign_records == 6  # 3 node + 3 topic records
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert landed(landing) == []

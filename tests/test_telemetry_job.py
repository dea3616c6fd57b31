"""The Spark job on real local Spark, checked against aggregates computed here independently.

The reference side decodes the landing files with the schema's own
``iter_items`` and ``validate`` and applies the documented rules (the
device folder owns its records, duplicates by ``id`` keep the first in
(date, file name) order, ``--since <= t < --until``, windows by the midpoint
of the record's window); it shares no code with the job.

Spark tests use one ``local[2]`` session for the module and are marked slow
(a cold JVM takes most of a minute here).  The rest need no Spark.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import math
import os
import random
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cbor2
import pytest

from p2p.telemetry import (
    BUCKETS,
    HISTOGRAMS,
    NODE_COUNTERS,
    TelemetryError,
    empty_histogram,
    iter_items,
    percentile,
    record_id,
    validate,
)
from p2p.telemetry._generate import DEFAULT_START, generate
from p2p.telemetry._job import (
    SPARK_MISSING,
    LandingFile,
    Options,
    classify,
    list_landing,
    parse_when,
    run,
    scan,
    spread,
    window_start,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

START = DEFAULT_START.timestamp()
DAY = DEFAULT_START.date().isoformat()
HAND = "00000000000000aa"
PEER = "00000000000000bb"
WIDTH = 1800.0
SPARK_REQUIRED = bool(os.environ.get("CI") or os.environ.get("P2P_REQUIRE_SPARK"))


# ------------------------------------------------------------ hand-made data


def rec(device: str, boot: int, seq: int, t: float, kind: str, **fields: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "id": record_id(device, boot, seq),
        "device": device,
        "boot": boot,
        "seq": seq,
        "t": t,
        "window": 0.0 if kind == "event" else 60.0,
        "kind": kind,
        **fields,
    }


def node(device: str, boot: int, seq: int, t: float, rss: int) -> dict[str, Any]:
    counters = dict.fromkeys((c for c in NODE_COUNTERS if c != "rss_bytes"), seq + 1)
    return rec(device, boot, seq, t, "node", rss_bytes=rss, cpu_s=0.25 * (seq + 1), **counters)


def hist(**buckets: int) -> list[int]:
    h = empty_histogram()
    for k, v in buckets.items():
        h[int(k[1:])] = v
    return h


def topic(device: str, boot: int, seq: int, t: float, name: str, **counts: Any) -> dict[str, Any]:
    lat = counts.pop("latency", hist(b10=counts.get("deliveries", 0)))
    return rec(
        device,
        boot,
        seq,
        t,
        "topic",
        topic=name,
        publications=counts.get("publications", 0),
        deliveries=counts.get("deliveries", 0),
        held=0,
        latency=lat,
        holdback=empty_histogram(),
        ack_round=hist(b20=counts.get("publications", 0)),
    )


def event(device: str, boot: int, seq: int, t: float, name: str, **extra: Any) -> dict[str, Any]:
    return rec(device, boot, seq, t, "event", event=name, **extra)


def enc(*records: dict[str, Any]) -> bytes:
    return b"".join(cbor2.dumps(r) for r in records)


def add_hand_made(landing: Path) -> dict[str, Any]:
    """A device with every kind of trouble, and a peer that watches it crash."""
    t0 = START + 600
    folder = landing / f"date={DAY}" / f"device={HAND}"
    folder.mkdir(parents=True)
    good = [
        node(HAND, 0, 0, t0, 50_000_000),
        topic(
            HAND,
            0,
            1,
            t0,
            "hand/exact",
            publications=4,
            deliveries=10,
            latency=hist(b3=5, b12=4, b30=1),
        ),
        topic(HAND, 0, 2, t0, "héllo/ünïcode", publications=1, deliveries=2),
        node(HAND, 0, 3, t0 + 60, 70_000_000),
        topic(
            HAND,
            0,
            4,
            t0 + 60,
            "hand/exact",
            publications=2,
            deliveries=6,
            latency=hist(b12=2, b40=4),
        ),
        event(HAND, 0, 5, t0 + 90, "crash", detail="watchdog reset"),
    ]
    bad_version = {**node(HAND, 0, 6, t0 + 95, 1), "v": 2}
    invalid = {**node(HAND, 0, 7, t0 + 96, 1), "packets_sent": -5}
    unknown_key = {**node(HAND, 0, 8, t0 + 97, 1), "rss": 3}
    misplaced = node(PEER, 9, 9, t0 + 98, 1)
    oversize = {"v": 1, "blob": "x" * 20_000}
    first = (
        enc(*good)
        + enc(bad_version, invalid, unknown_key, misplaced)
        + cbor2.dumps(oversize)
        + enc(good[0])[:7]  # torn tail
    )
    (folder / "00000000-000000000000.cbor").write_bytes(first)
    # re-upload overlapping the first file (identical duplicates), then a new boot
    rebooted = [
        event(HAND, 1, 0, t0 + 400, "start", detail="boot 1"),
        node(HAND, 1, 1, t0 + 460, 40_000_000),
        topic(HAND, 1, 2, t0 + 460, "hand/exact", publications=0, deliveries=3, latency=hist(b5=3)),
    ]
    (folder / "00000000-000000000003.cbor").write_bytes(enc(*good[3:]))
    (folder / "00000001-000000000000.cbor").write_bytes(enc(*rebooted))
    conflicting = {**rebooted[1], "rss_bytes": 1}  # same id, different content: first one wins
    (folder / "00000001-000000000001.cbor").write_bytes(enc(conflicting))
    (folder / "00000002-000000000000.cbor").write_bytes(b"")  # empty file
    (folder / "notes.txt").write_text("not a landing file")
    (folder / "00000003-000000000000.tmp").write_bytes(b"\xff")  # collector in flight: ignored
    (landing / "_incoming" / HAND).mkdir(parents=True)
    (landing / "_incoming" / HAND / "x.part").write_bytes(b"\xff\xff")
    unknown = landing / "date=unknown" / f"device={HAND}"
    unknown.mkdir(parents=True)
    (unknown / "00000000-000000000000.cbor").write_bytes(
        cbor2.dumps({**node(HAND, 0, 99, t0, 1), "t": "yesterday"})
    )
    peer = landing / f"date={DAY}" / f"device={PEER}"
    peer.mkdir(parents=True)
    (peer / "00000000-000000000000.cbor").write_bytes(
        enc(
            node(PEER, 0, 0, t0, 30_000_000),
            event(PEER, 0, 1, t0 + 95, "suspect", peer=HAND, detail="no heartbeat"),
            event(PEER, 0, 2, t0 + 120, "repair", peer=HAND),
            topic(
                PEER,
                0,
                3,
                t0 + 120,
                "hand/exact",
                publications=1,
                deliveries=7,
                latency=hist(b3=1, b39=6),
            ),
            event(PEER, 0, 4, t0 + 401, "unsuspect", peer=HAND),
            node(PEER, 0, 5, 1e15, 1),  # past year 9999: no timestamp holds it, validate refuses
        )
    )
    return {"bad_version": bad_version, "t0": t0}


# ------------------------------------------------------- the reference side


def reference(
    landing: Path, since: float | None = None, until: float | None = None, width: float = WIDTH
) -> dict[str, Any]:
    """The job's outputs, computed the simple way from the same files."""
    reasons: Counter[str] = Counter()
    quarantined_files: Counter[tuple[str, str]] = Counter()
    seen: dict[str, dict[str, Any]] = {}
    kept: list[dict[str, Any]] = []
    items = duplicates = outside = valid = 0
    dups_by_device: Counter[str] = Counter()
    quarantined_by_device: Counter[str] = Counter()
    files = sorted(
        (p for p in landing.glob("date=*/device=*/*.cbor")),
        key=lambda p: (p.parent.parent.name, p.parent.name, p.name),
    )
    for path in files:
        folder_device = path.parent.name.removeprefix("device=")
        for item, err in iter_items(path.read_bytes()):
            items += 1
            reason = None
            if err is not None:
                reason = "oversize" if "exceeds" in err else "undecodable"
            else:
                try:
                    r = validate(item)
                except TelemetryError as exc:
                    reason = "schema_version" if str(exc).startswith("v:") else "invalid"
                else:
                    if r["device"] != folder_device:
                        reason = "misplaced"
            if reason is not None:
                reasons[reason] += 1
                quarantined_files[(str(path), reason)] += 1
                quarantined_by_device[folder_device] += 1
                continue
            valid += 1
            if r["id"] in seen:
                duplicates += 1
                dups_by_device[r["device"]] += 1
                continue
            seen[r["id"]] = r
            if (since is not None and r["t"] < since) or (until is not None and r["t"] >= until):
                outside += 1
                continue
            kept.append(r)
    return {
        "items": items,
        "valid": valid,
        "reasons": reasons,
        "quarantined_files": quarantined_files,
        "duplicates": duplicates,
        "outside": outside,
        "kept": kept,
        "dups_by_device": dups_by_device,
        "quarantined_by_device": quarantined_by_device,
        "files": len(files),
        "width": width,
    }


def merged(records: list[dict[str, Any]], name: str) -> list[int]:
    out = [0] * (BUCKETS + 1)
    for r in records:
        out = [a + b for a, b in zip(out, r[name], strict=True)]
    return out


def ws_of(r: dict[str, Any], width: float) -> float:
    return float(math.floor((r["t"] - r["window"] / 2) / width) * width)


# ------------------------------------------------------------------ spark


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    if not SPARK_REQUIRED and importlib.util.find_spec("pyspark") is None:
        pytest.skip("the spark extra is not installed (pip install 'vcube-ps[spark]')")
    from p2p.telemetry._spark import spark_session

    session = spark_session(
        "local[2]",
        driver_memory="1g",
        shuffle_partitions=4,
        extra={"spark.default.parallelism": "4"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("telemetry") / "landing"
    stats = generate(root, devices=5, hours=2, seed=7, jobs=1, start=START)
    return root, {**stats, **add_hand_made(root)}


def table(spark: SparkSession, out: Path, name: str) -> list[dict[str, Any]]:
    """Rows of an output table, timestamps as Unix seconds."""
    from pyspark.sql import functions as fn
    from pyspark.sql.types import TimestampType

    df = spark.read.parquet(str(out / name))
    cols = [
        fn.col(f.name).cast("double").alias(f.name)
        if isinstance(f.dataType, TimestampType)
        else fn.col(f.name)
        for f in df.schema.fields
    ]
    return [row.asDict() for row in df.select(*cols).collect()]


@pytest.fixture(scope="module")
def full(
    spark: SparkSession,
    landing: tuple[Path, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("out") / "full"
    opts = Options(landing=str(landing[0]), out=str(out), window=WIDTH, progress=False)
    return out, run(opts, spark=spark)


@pytest.mark.slow
def test_summary_counts(
    full: tuple[Path, dict[str, Any]], landing: tuple[Path, dict[str, Any]]
) -> None:
    out, summary = full
    ref = reference(landing[0])
    assert summary["records_read"] == ref["items"]
    assert summary["valid"] == ref["valid"]
    assert summary["quarantined"] == ref["items"] - ref["valid"]
    assert summary["by_reason"] == dict(ref["reasons"])
    assert set(ref["reasons"]) == {
        "undecodable",
        "oversize",
        "schema_version",
        "invalid",
        "misplaced",
    }
    assert summary["duplicates_dropped"] == ref["duplicates"] >= 3
    assert summary["duplicates_conflicting"] == 1
    assert summary["aggregated"] == len(ref["kept"])
    assert summary["files"] == ref["files"]
    assert summary["files_skipped"] == 1
    assert summary["skipped"] == [f"date={DAY}/device={HAND}/notes.txt"]
    assert summary["invalid_by_field"]["packets_sent"] >= 1
    assert summary["invalid_by_field"]["unknown_keys"] >= 1
    assert summary["invalid_by_field"]["t"] == 2  # "yesterday", and year 33658
    assert summary["rows"]["quarantine"] == summary["quarantined"]
    assert (out / "summary.json").is_file()


@pytest.mark.slow
def test_devices(
    spark: SparkSession, full: tuple[Path, dict[str, Any]], landing: tuple[Path, dict[str, Any]]
) -> None:
    ref = reference(landing[0])
    rows = {r["device"]: r for r in table(spark, full[0], "devices")}
    by_device: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ref["kept"]:
        by_device[r["device"]].append(r)
    assert set(rows) == set(by_device) | set(ref["quarantined_by_device"])
    for device, recs in by_device.items():
        row = rows[device]
        nodes = [r for r in recs if r["kind"] == "node"]
        topics = [r for r in recs if r["kind"] == "topic"]
        assert row["records"] == len(recs)
        assert row["node_records"] == len(nodes)
        assert row["topic_records"] == len(topics)
        assert row["events"] == len(recs) - len(nodes) - len(topics)
        assert row["boots"] == len({r["boot"] for r in recs})
        assert row["rss_max_bytes"] == max(r["rss_bytes"] for r in nodes)
        assert row["rss_mean_bytes"] == pytest.approx(
            sum(r["rss_bytes"] for r in nodes) / len(nodes)
        )
        assert row["cpu_s"] == pytest.approx(sum(r["cpu_s"] for r in nodes))
        for key in ("packets_sent", "bytes_received", "suspicions", "repairs", "dropped"):
            assert row[key] == sum(r[key] for r in nodes), key
        assert row["publications"] == sum(r["publications"] for r in topics)
        assert row["deliveries"] == sum(r["deliveries"] for r in topics)
        assert row["crashes"] == sum(r.get("event") == "crash" for r in recs)
        assert row["first_seen"] == pytest.approx(min(r["t"] - r["window"] for r in recs), abs=1e-5)
        assert row["last_seen"] == pytest.approx(max(r["t"] for r in recs), abs=1e-5)
        assert row["duplicates"] == ref["dups_by_device"][device]
        assert row["quarantined"] == ref["quarantined_by_device"][device]
    hand = rows[HAND]
    assert hand["rss_max_bytes"] == 70_000_000  # the conflicting duplicate (rss 1) was dropped
    assert hand["crashes"] == 1
    assert hand["boots"] == 2


@pytest.mark.slow
def test_topics_and_merged_percentiles(
    spark: SparkSession, full: tuple[Path, dict[str, Any]], landing: tuple[Path, dict[str, Any]]
) -> None:
    ref = reference(landing[0])
    rows = {r["topic"]: r for r in table(spark, full[0], "topics")}
    by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ref["kept"]:
        if r["kind"] == "topic":
            by_topic[r["topic"]].append(r)
    assert set(rows) == set(by_topic)
    for name, recs in by_topic.items():
        row = rows[name]
        assert row["records"] == len(recs)
        assert row["devices"] == len({r["device"] for r in recs})
        assert row["publications"] == sum(r["publications"] for r in recs)
        assert row["deliveries"] == sum(r["deliveries"] for r in recs)
        assert row["held"] == sum(r["held"] for r in recs)
        for h in HISTOGRAMS:
            m = merged(recs, h)
            assert row[f"{h}_hist"] == m, (name, h)
            for q in (0.5, 0.95, 0.99):
                assert row[f"{h}_p{round(q * 100)}_ms"] == percentile(m, q), (name, h, q)
    exact = rows["hand/exact"]
    # 5+4+1 + 2+4 + 3 + 1+6 = 26 latencies: b3 x6, b5 x3, b12 x6, b30 x1, b39 x6, b40 x4
    assert exact["latency_hist"][3] == 6
    assert exact["latency_hist"][40] == 4
    assert exact["latency_p50_ms"] == percentile(hist(b3=6, b5=3, b12=6, b30=1, b39=6, b40=4), 0.5)
    assert exact["devices"] == 2
    assert "héllo/ünïcode" in rows
    ranked = sorted(rows.values(), key=lambda r: (-r["publications"], -r["deliveries"], r["topic"]))
    assert [r["hot_rank"] for r in ranked] == list(range(1, len(ranked) + 1))
    span = max(r["t"] for r in ref["kept"] if r["kind"] != "event") - min(
        r["t"] - r["window"] for r in ref["kept"] if r["kind"] != "event"
    )
    top = ranked[0]
    assert top["pub_rate_per_s"] == pytest.approx(top["publications"] / span)


@pytest.mark.slow
def test_windows_and_fleet(
    spark: SparkSession, full: tuple[Path, dict[str, Any]], landing: tuple[Path, dict[str, Any]]
) -> None:
    ref = reference(landing[0])
    windows = {(r["window_start"], r["topic"]): r for r in table(spark, full[0], "windows")}
    expect: dict[tuple[float, str], list[dict[str, Any]]] = defaultdict(list)
    for r in ref["kept"]:
        if r["kind"] == "topic":
            expect[(ws_of(r, WIDTH), r["topic"])].append(r)
    assert set(windows) == set(expect)
    for key, recs in expect.items():
        row = windows[key]
        assert row["window_end"] == key[0] + WIDTH
        assert row["publications"] == sum(r["publications"] for r in recs)
        assert row["deliveries"] == sum(r["deliveries"] for r in recs)
        assert row["devices"] == len({r["device"] for r in recs})
        assert row["latency_p99_ms"] == percentile(merged(recs, "latency"), 0.99)
        assert row["ack_round_p50_ms"] == percentile(merged(recs, "ack_round"), 0.5)
    fleet = {r["window_start"]: r for r in table(spark, full[0], "fleet")}
    per_window: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in ref["kept"]:
        per_window[ws_of(r, WIDTH)].append(r)
    assert set(fleet) == set(per_window)
    for ws, recs in per_window.items():
        row = fleet[ws]
        nodes = [r for r in recs if r["kind"] == "node"]
        topics = [r for r in recs if r["kind"] == "topic"]
        assert row["records"] == len(recs)
        assert row["devices"] == len({r["device"] for r in recs})
        assert row["node_records"] == len(nodes)
        assert row["publications"] == sum(r["publications"] for r in topics)
        assert row["rss_max_bytes"] == (max(r["rss_bytes"] for r in nodes) if nodes else None)
        assert row["latency_p95_ms"] == percentile(merged(topics, "latency"), 0.95)
        for name in ("crash", "suspect", "repair", "start"):
            assert row[f"event_{name}"] == sum(r.get("event") == name for r in recs)


@pytest.mark.slow
def test_timeline_and_quarantine(
    spark: SparkSession, full: tuple[Path, dict[str, Any]], landing: tuple[Path, dict[str, Any]]
) -> None:
    ref = reference(landing[0])
    timeline = table(spark, full[0], "timeline")
    expect = sorted(
        (r for r in ref["kept"] if r["kind"] == "event"),
        key=lambda r: (r["t"], r["device"], r["boot"], r["seq"]),
    )
    assert [(r["device"], r["seq"], r["event"]) for r in timeline] == [
        (r["device"], r["seq"], r["event"]) for r in expect
    ]
    assert [r["t_unix"] for r in timeline] == [r["t"] for r in expect]
    assert {"crash", "suspect", "repair", "unsuspect", "start"} <= {r["event"] for r in timeline}
    quarantine = table(spark, full[0], "quarantine")
    got = Counter((r["file"], r["reason"]) for r in quarantine)
    assert got == ref["quarantined_files"]
    v2 = [r for r in quarantine if r["reason"] == "schema_version" and HAND in r["file"]]
    assert len(v2) == 1
    assert v2[0]["raw_hex"] == cbor2.dumps(landing[1]["bad_version"])[:64].hex()
    assert v2[0]["field"] == "v"
    data = Path(v2[0]["file"]).read_bytes()
    assert (
        cbor2.loads(data[v2[0]["offset"] :][: len(cbor2.dumps(landing[1]["bad_version"]))])
        == (landing[1]["bad_version"])
    )
    torn = [r for r in quarantine if r["reason"] == "undecodable" and HAND in r["file"]]
    assert len(torn) == 1
    assert torn[0]["raw_hex"] == cbor2.dumps(node(HAND, 0, 0, START + 600, 50_000_000))[:7].hex()


@pytest.mark.slow
def test_report(full: tuple[Path, dict[str, Any]], spark: SparkSession) -> None:
    out, summary = full
    page = (out / "report.html").read_text(encoding="utf-8")
    for chart in (
        "hot-topics",
        "rates",
        "latency",
        "events",
        "timeline",
        "rss",
        "cpu",
        "quarantine",
        "fleet-rss",
    ):
        assert f'<svg data-chart="{chart}"' in page, chart
    assert page.count("<polyline") >= 3
    assert f"{summary['records_read']:,}" in page
    assert f"{summary['quarantined']:,}" in page
    assert f"{summary['duplicates_dropped']:,}" in page
    hottest = min(table(spark, out, "topics"), key=lambda r: r["hot_rank"])
    assert hottest["topic"] in page
    assert f"{hottest['publications']:,}" in page
    assert HAND in page  # the crashed device has a timeline lane
    for reason in summary["by_reason"]:
        assert reason in page
    assert "<script" not in page
    assert "https://" not in page
    assert page.replace("http://www.w3.org/2000/svg", "").count("http://") == 0


@pytest.mark.slow
def test_since_until(
    spark: SparkSession,
    landing: tuple[Path, dict[str, Any]],
    tmp_path: Path,
) -> None:
    since = dt.datetime.fromtimestamp(START + 1800, dt.UTC).isoformat()
    until = dt.datetime.fromtimestamp(START + 5400, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    lo, hi = parse_when(since), parse_when(until)
    assert lo == START + 1800
    assert hi == START + 5400
    opts = Options(
        landing=str(landing[0]),
        out=str(tmp_path),
        since=lo,
        until=hi,
        window=WIDTH,
        progress=False,
        report=False,
    )
    summary = run(opts, spark=spark)
    ref = reference(landing[0], lo, hi)
    assert summary["outside_range"] == ref["outside"] > 0
    assert summary["aggregated"] == len(ref["kept"])
    assert all(lo <= r["t"] < hi for r in ref["kept"])
    devices = {r["device"]: r for r in table(spark, tmp_path, "devices")}
    counts = Counter(r["device"] for r in ref["kept"])
    for device, n in counts.items():
        assert devices[device]["records"] == n
    topics = {r["topic"]: r for r in table(spark, tmp_path, "topics")}
    pubs: Counter[str] = Counter()
    for r in ref["kept"]:
        if r["kind"] == "topic":
            pubs[r["topic"]] += r["publications"]
    assert {t: r["publications"] for t, r in topics.items()} == dict(pubs)
    assert not (tmp_path / "report.html").exists()


@pytest.mark.slow
def test_uri_landing_reads_through_hadoop(
    spark: SparkSession,
    full: tuple[Path, dict[str, Any]],
    landing: tuple[Path, dict[str, Any]],
    tmp_path: Path,
) -> None:
    """``file://`` goes the cluster way (Hadoop listing, binaryFiles, grouped by device)."""
    opts = Options(
        landing=landing[0].as_uri(),
        out=str(tmp_path),
        window=WIDTH,
        progress=False,
        report=False,
        partitions=3,
    )
    summary = run(opts, spark=spark)
    base = full[1]
    for key in (
        "records_read",
        "valid",
        "quarantined",
        "by_reason",
        "duplicates_dropped",
        "aggregated",
        "files",
        "files_skipped",
    ):
        assert summary[key] == base[key], key
    for name in ("devices", "topics", "fleet"):
        mine, base_rows = table(spark, tmp_path, name), table(spark, full[0], name)
        assert len(mine) == len(base_rows)
        for a, b in zip(mine, base_rows, strict=True):
            cpu_a, cpu_b = a.pop("cpu_pct", None), b.pop("cpu_pct", None)  # float sums: any order
            assert a == b, name
            assert cpu_a == pytest.approx(cpu_b), name


# ---------------------------------------------------------------- no spark


def test_missing_landing_dir_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "p2p.telemetry._cli",
            "telemetry",
            "aggregate",
            str(missing),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == f"p2p: error: landing directory {missing} does not exist"
    assert not (tmp_path / "out").exists()


def test_p2p_cli_wiring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from p2p import cli

    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert "telemetry" in (sub.choices or {})
    code = cli.main(["telemetry", "aggregate", str(tmp_path / "nowhere"), "--out", str(tmp_path)])
    assert code == 2
    assert "landing directory" in capsys.readouterr().err


def test_empty_landing_and_bad_options(tmp_path: Path) -> None:
    (tmp_path / "landing").mkdir()
    with pytest.raises(TelemetryError, match="--since must be before --until"):
        run(Options(landing=str(tmp_path / "landing"), out=str(tmp_path / "o"), since=2, until=1))
    with pytest.raises(TelemetryError, match="must not contain each other"):
        run(Options(landing=str(tmp_path / "landing"), out=str(tmp_path / "landing" / "o")))
    with pytest.raises(TelemetryError, match="not an ISO date"):
        parse_when("yesterday")
    assert parse_when("2026-03-02") == START
    assert parse_when("2026-03-02T01:00:00+01:00") == START


def test_missing_pyspark_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "landing").mkdir()
    monkeypatch.setitem(sys.modules, "pyspark", None)
    with pytest.raises(TelemetryError) as err:
        run(Options(landing=str(tmp_path / "landing"), out=str(tmp_path / "o")))
    assert str(err.value) == SPARK_MISSING
    assert "pip install 'vcube-ps[spark]'" in SPARK_MISSING


def test_scan_agrees_with_iter_items() -> None:
    """The job's offset-keeping decoder is the schema's iter_items, plus offsets."""
    rng = random.Random(5)
    records = [node(HAND, 0, i, START + i, 1000 + i) for i in range(20)]
    for _ in range(300):
        data = bytearray(enc(*rng.sample(records, rng.randint(0, 6))))
        for _ in range(rng.randint(0, 3)):
            if data:
                data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data += cbor2.dumps({"x": "y" * 17_000})
        if rng.random() < 0.3 and data:
            del data[rng.randrange(len(data)) :]
        blob = bytes(data)
        mine = list(scan(blob))
        theirs = list(iter_items(blob))
        assert [(item, err) for _, _, item, err in mine] == theirs
        for start, end, item, err in mine:
            if err is None:
                assert cbor2.loads(blob[start:end]) == item


def test_classify() -> None:
    assert classify("undecodable CBOR at byte 7: eof", False) == ("undecodable", "")
    assert classify("record at byte 0 exceeds 16384 bytes", False) == ("oversize", "")
    assert classify("v: unsupported schema version 2", True) == ("schema_version", "v")
    assert classify("packets_sent: expected an int >= 0, got -1", True) == (
        "invalid",
        "packets_sent",
    )
    assert classify("unknown keys ['rss']", True) == ("invalid", "unknown_keys")


def test_listing_and_spreading(landing: tuple[Path, dict[str, Any]]) -> None:
    files, skipped, pruned = list_landing(str(landing[0]))
    assert skipped == [f"date={DAY}/device={HAND}/notes.txt"]
    assert pruned == 0
    assert not any("_incoming" in f.path or f.path.endswith(".tmp") for f in files)
    assert any(f.date == "unknown" for f in files)
    bins = spread(files, 3)
    assert len(bins) == 3
    owner = {}
    for i, b in enumerate(bins):
        for device, fs in b:
            assert device not in owner  # all files of a device in one task
            owner[device] = i
            assert all(isinstance(f, LandingFile) and f.device == device for f in fs)
    assert sum(len(fs) for b in bins for _, fs in b) == len(files)
    later = START + 3 * 86400
    _, _, pruned = list_landing(str(landing[0]), since=later)
    assert pruned == len([f for f in files if f.date != "unknown"])


def test_window_start() -> None:
    assert window_start(START + 3600, 60, 3600) == START  # a window ending on the hour
    assert window_start(START + 3601, 60, 3600) == START
    assert window_start(START + 3631, 60, 3600) == START + 3600
    assert window_start(START + 3600, 0, 3600) == START + 3600  # an event on the hour

"""Differential test: every table the job writes equals a plain-Python reference, field by field.

The landing mixes generated fleet data with hand-made trouble: every
quarantine reason, histograms whose counts are bools, floats, negative or
too large (the batch path must send them to ``validate``), integer times,
identical and conflicting duplicates across files, records outside
``--since``/``--until``.  The reference reads the files with the schema's
``iter_items``/``validate`` and applies the documented rules one record at
a time; it shares no code with the job but ``percentile``.  The job runs
twice, with the batch record path and with ``validate`` alone, and both
must agree with the reference.
"""

from __future__ import annotations

import importlib.util
import io
import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cbor2
import pytest

from p2p.telemetry import (
    BUCKETS,
    EVENTS,
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

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow
START = DEFAULT_START.timestamp()
DAY = DEFAULT_START.date().isoformat()
DEV = "00000000000000d1"
OTHER = "00000000000000d2"
WIDTH = 1200.0
SINCE, UNTIL = START + 300, START + 6600
QS = (0.5, 0.95, 0.99)
SUMMED = tuple(c for c in NODE_COUNTERS if c not in ("rss_bytes", "connections"))
FLEET_NODE = (
    "packets_sent",
    "packets_received",
    "bytes_sent",
    "bytes_received",
    "suspicions",
    "repairs",
    "rejected",
    "dropped",
)


# ------------------------------------------------------------------ the landing


def base(
    device: str, boot: int, seq: int, t: float, kind: str, window: float = 60.0
) -> dict[str, Any]:
    return {
        "v": 1,
        "id": record_id(device, boot, seq),
        "device": device,
        "boot": boot,
        "seq": seq,
        "t": t,
        "window": 0.0 if kind == "event" else window,
        "kind": kind,
    }


def node(device: str, boot: int, seq: int, t: float, **over: Any) -> dict[str, Any]:
    counters = {c: 3 * seq + i for i, c in enumerate(NODE_COUNTERS)}
    return {**base(device, boot, seq, t, "node"), **counters, "cpu_s": 0.5 + seq / 7, **over}


def topic(device: str, boot: int, seq: int, t: float, name: str, **over: Any) -> dict[str, Any]:
    lat = empty_histogram()
    lat[seq % (BUCKETS + 1)] = seq + 1
    ack = empty_histogram()
    ack[-1] = 2
    return {
        **base(device, boot, seq, t, "topic"),
        "topic": name,
        "publications": seq,
        "deliveries": 2 * seq + 1,
        "held": seq % 3,
        "latency": lat,
        "holdback": empty_histogram(),
        "ack_round": ack,
        **over,
    }


def event(device: str, boot: int, seq: int, t: float, name: str, **extra: Any) -> dict[str, Any]:
    return {**base(device, boot, seq, t, "event"), "event": name, **extra}


def write(landing: Path, device: str, name: str, data: bytes) -> None:
    folder = landing / f"date={DAY}" / f"device={device}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def enc(*records: dict[str, Any]) -> bytes:
    return b"".join(cbor2.dumps(r) for r in records)


def trouble(landing: Path) -> None:
    t = START + 900
    hist = empty_histogram
    good = [
        node(DEV, 0, 0, t),
        topic(DEV, 0, 1, t, "d/hot"),
        topic(DEV, 0, 2, t + 60, "d/hot", latency=[*hist()[:-1], 7]),
        node(DEV, 0, 3, t + 60.5, cpu_s=2),  # an int cpu_s: valid, the slow path
        topic(DEV, 0, 4, t + 120, "d/ünï"),
        event(DEV, 0, 5, t + 130, "crash", detail="watchdog"),
        {**topic(DEV, 0, 6, t + 180, "d/hot"), "t": int(t + 180)},  # an int time: valid
        topic(DEV, 0, 7, 100.0, "d/early"),  # before --since
        topic(DEV, 0, 8, UNTIL + 5, "d/late"),  # after --until
        node(DEV, 0, 9, t + 3600),
        topic(DEV, 0, 10, t + 3600, "d/hot", held=2**40),  # big but fine
    ]
    bad = [
        topic(DEV, 0, 20, t, "d/hot", latency=[True, *hist()[1:]]),  # a bool count
        topic(DEV, 0, 21, t, "d/hot", holdback=[*hist()[:-1], 1.0]),  # a float count
        topic(DEV, 0, 22, t, "d/hot", ack_round=[-1, *hist()[1:]]),  # negative
        topic(DEV, 0, 23, t, "d/hot", latency=[2**63, *hist()[1:]]),  # too large
        topic(DEV, 0, 24, t, "d/hot", latency=hist()[1:]),  # 40 counts
        topic(DEV, 0, 25, t, "d/hot", latency=[[1], *hist()[1:]]),  # nested
        topic(DEV, 0, 26, t, "d/hot", topic=""),
        node(DEV, 0, 27, t, cpu_s=math.inf),
        node(DEV, 0, 28, t, extra=1),
        {**node(DEV, 0, 29, t), "v": 2},
        {**node(DEV, 0, 30, t), "id": "x"},
        node(OTHER, 0, 31, t),  # misplaced
        event(DEV, 0, 32, t, "reboot"),
        topic(DEV, 0, 33, t, "d/hot", window=0.0),
    ]
    big = [topic(DEV, 0, 40, t + 60, "d/hot", latency=[2**33, *hist()[1:]])]  # valid, > 2**32
    write(
        landing,
        DEV,
        "00000000-000000000000.cbor",
        enc(*good, *bad[6:]) + cbor2.dumps({"v": 1, "pad": "x" * 20000}) + enc(good[0])[:9],
    )
    # Each bad histogram in a file of otherwise good topic records: the batch sees it.
    for i, rec in enumerate(bad[:6]):
        fine = topic(DEV, 0, 50 + i, t + 240, "d/hot")
        write(landing, DEV, f"00000000-0000000000{20 + i}.cbor", enc(fine, rec))
    write(landing, DEV, "00000000-000000000003.cbor", enc(*good[3:6], *big))  # duplicates
    write(landing, DEV, "00000000-000000000009.cbor", enc({**good[9], "rss_bytes": 1}))
    write(
        landing,
        OTHER,
        "00000001-000000000000.cbor",
        enc(
            node(OTHER, 1, 0, t + 30),
            event(OTHER, 1, 1, t + 131, "suspect", peer=DEV),
            topic(OTHER, 1, 2, t + 200, "d/hot", latency=[*hist()[:-1], 2**31]),
        ),
    )


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("diff") / "landing"
    generate(root, devices=4, hours=2, seed=11, jobs=1, start=START)
    trouble(root)
    return root


# ---------------------------------------------------------------- the reference


def ws_of(t: float, length: float) -> float:
    return float(math.floor((t - length / 2) / WIDTH) * WIDTH)


def pcts(h: list[int]) -> list[float | None]:
    return [percentile(h, q) for q in QS]


def add(a: list[int], b: list[int]) -> list[int]:
    return [x + y for x, y in zip(a, b, strict=True)]


def rate(n: int, secs: float) -> float | None:
    return n / secs if secs > 0 else None


def spans(data: bytes) -> list[tuple[int, int]]:
    """Byte ranges of a file's CBOR items; a corrupt one runs to the end and ends the list."""
    stream = io.BytesIO(data)
    decoder = cbor2.CBORDecoder(stream)
    out = []
    while stream.tell() < len(data):
        start = stream.tell()
        try:
            decoder.decode()
        except Exception:
            out.append((start, len(data)))
            break
        out.append((start, stream.tell()))
    return out


def read(landing: Path) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]], Counter[str]]:
    """Kept records in file order, quarantine rows, and per-device duplicate counts."""
    files = sorted(
        landing.glob("date=*/device=*/*.cbor"),
        key=lambda p: (p.parent.parent.name, p.parent.name, p.name),
    )
    kept, bad, dups, seen = [], [], Counter[str](), set()
    for path in files:
        data = path.read_bytes()
        folder, date = path.parent.name[7:], path.parent.parent.name[5:]
        for (start, end), (item, err) in zip(spans(data), iter_items(data), strict=True):
            raw = data[start:end]
            if err is not None:
                reason = "oversize" if "exceeds" in err else "undecodable"
                bad.append((str(path), start, reason, "", err, raw[:64].hex(), folder, date))
                continue
            try:
                rec = validate(item)
            except TelemetryError as exc:
                msg = str(exc)
                reason, fld = (
                    ("schema_version", "v")
                    if msg.startswith("v:")
                    else ("invalid", "unknown_keys")
                    if msg.startswith("unknown keys")
                    else ("invalid", msg.split(":", 1)[0][:40])
                )
                bad.append((str(path), start, reason, fld, msg, raw[:64].hex(), folder, date))
                continue
            if rec["device"] != folder:
                msg = f"record of device {rec['device']} under device={folder}"
                bad.append(
                    (str(path), start, "misplaced", "device", msg, raw[:64].hex(), folder, date)
                )
                continue
            if rec["id"] in seen:
                dups[folder] += 1
                continue
            seen.add(rec["id"])
            if SINCE <= rec["t"] < UNTIL:
                kept.append(rec)
    return kept, bad, dups


def reference(landing: Path) -> dict[str, list[tuple[Any, ...]]]:
    kept, bad, dups = read(landing)
    timed = [r for r in kept if r["kind"] != "event"]
    span = (min(r["t"] - r["window"] for r in timed), max(r["t"] for r in timed))
    quarantined = Counter(row[6] for row in bad)
    devices = []
    for d in sorted({r["device"] for r in kept} | set(quarantined)):
        rs = [r for r in kept if r["device"] == d]
        ns = [r for r in rs if r["kind"] == "node"]
        ts = [r for r in rs if r["kind"] == "topic"]
        es = [r for r in rs if r["kind"] == "event"]
        cpu, secs = sum(r["cpu_s"] for r in ns), sum(r["window"] for r in ns)
        devices.append(
            (
                d,
                len(rs),
                len(ns),
                len(ts),
                len(es),
                len({r["boot"] for r in rs}),
                min(r["t"] - r["window"] for r in rs) if rs else None,
                max(r["t"] for r in rs) if rs else None,
                sum(r["rss_bytes"] for r in ns) / len(ns) if ns else None,
                max(r["rss_bytes"] for r in ns) if ns else None,
                cpu,
                100 * cpu / secs if secs else None,
                sum(r["connections"] for r in ns) / len(ns) if ns else None,
                *(sum(r[c] for r in ns) for c in SUMMED),
                *(sum(r[c] for r in ts) for c in ("publications", "deliveries", "held")),
                sum(r["event"] == "crash" for r in es),
                sum(r["event"] == "start" for r in es),
                dups[d],
                quarantined[d],
            )
        )
    return {
        "devices": devices,
        "topics": topics(kept, span),
        "windows": windows(kept, span),
        "fleet": fleet(kept, span),
        "timeline": sorted(
            (
                (
                    r["t"],
                    r["t"],
                    r["device"],
                    r["boot"],
                    r["seq"],
                    r["event"],
                    r.get("peer"),
                    r.get("detail"),
                    r["id"],
                )
                for r in kept
                if r["kind"] == "event"
            ),
            key=lambda row: row[1:5],
        ),
        "quarantine": sorted(bad, key=lambda row: (row[0], row[1])),
    }


def traffic(rs: list[dict[str, Any]], secs: float) -> tuple[Any, ...]:
    hists = [[0] * (BUCKETS + 1) for _ in HISTOGRAMS]
    for r in rs:
        hists = [add(h, r[name]) for h, name in zip(hists, HISTOGRAMS, strict=True)]
    pubs, dels = sum(r["publications"] for r in rs), sum(r["deliveries"] for r in rs)
    return (
        len(rs),
        len({r["device"] for r in rs}),
        pubs,
        dels,
        sum(r["held"] for r in rs),
        rate(pubs, secs),
        rate(dels, secs),
        *(p for h in hists for p in pcts(h)),
        *hists,
    )


def topics(kept: list[dict[str, Any]], span: tuple[float, float]) -> list[tuple[Any, ...]]:
    by: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in kept:
        if r["kind"] == "topic":
            by[r["topic"]].append(r)
    rows = []
    for name, rs in by.items():
        tr = traffic(rs, span[1] - span[0])
        first, last = min(r["t"] - r["window"] for r in rs), max(r["t"] for r in rs)
        rows.append((name, *tr[:16], first, last, *tr[16:]))
    rows.sort(key=lambda row: (-row[3], -row[4], row[0]))
    return [(row[0], rank, *row[1:]) for rank, row in enumerate(rows, 1)]


def covered(ws: float, span: tuple[float, float]) -> float:
    c = min(ws + WIDTH, span[1]) - max(ws, span[0])
    return c if c > 0 else WIDTH


def windows(kept: list[dict[str, Any]], span: tuple[float, float]) -> list[tuple[Any, ...]]:
    by: defaultdict[tuple[float, str], list[dict[str, Any]]] = defaultdict(list)
    for r in kept:
        if r["kind"] == "topic":
            by[(ws_of(r["t"], r["window"]), r["topic"])].append(r)
    return [
        (ws, ws + WIDTH, name, *traffic(rs, covered(ws, span)))
        for (ws, name), rs in sorted(by.items())
    ]


def fleet(kept: list[dict[str, Any]], span: tuple[float, float]) -> list[tuple[Any, ...]]:
    by: defaultdict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in kept:
        by[ws_of(r["t"], r["window"])].append(r)
    rows = []
    for ws, rs in sorted(by.items()):
        ns = [r for r in rs if r["kind"] == "node"]
        ts = [r for r in rs if r["kind"] == "topic"]
        es = [r for r in rs if r["kind"] == "event"]
        lat = [0] * (BUCKETS + 1)
        for r in ts:
            lat = add(lat, r["latency"])
        secs, pubs, dels = (
            covered(ws, span),
            sum(r["publications"] for r in ts),
            sum(r["deliveries"] for r in ts),
        )
        node_secs = sum(r["window"] for r in ns)
        rows.append(
            (
                ws,
                ws + WIDTH,
                len({r["device"] for r in rs}),
                len(rs),
                len(ns),
                len(ts),
                len(es),
                pubs,
                dels,
                sum(r["held"] for r in ts),
                rate(pubs, secs),
                rate(dels, secs),
                *pcts(lat),
                sum(r["rss_bytes"] for r in ns) / len(ns) if ns else None,
                max(r["rss_bytes"] for r in ns) if ns else None,
                100 * sum(r["cpu_s"] for r in ns) / node_secs if node_secs else None,
                *(sum(r[c] for r in ns) for c in FLEET_NODE),
                *(sum(r["event"] == e for r in es) for e in EVENTS),
                lat,
            )
        )
    return rows


# ----------------------------------------------------------------------- the job


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    if not os.environ.get("CI") and importlib.util.find_spec("pyspark") is None:
        pytest.skip("the spark extra is not installed (pip install 'vcube-ps[spark]')")
    from p2p.telemetry._spark import spark_session

    session = spark_session("local[2]", driver_memory="1g", shuffle_partitions=4)
    yield session
    session.stop()


def job_tables(spark: SparkSession, out: Path) -> dict[str, list[tuple[Any, ...]]]:
    from pyspark.sql import functions as fn
    from pyspark.sql.types import TimestampType

    got = {}
    for name in ("devices", "topics", "windows", "fleet", "timeline", "quarantine"):
        df = spark.read.parquet(str(out / name))
        cols = [
            fn.col(f.name).cast("double")
            if isinstance(f.dataType, TimestampType)
            else fn.col(f.name)
            for f in df.schema.fields
        ]
        got[name] = [tuple(row) for row in df.select(*cols).collect()]
    return got


def same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, float | int):
        return got == pytest.approx(want, rel=1e-12, abs=1e-9)
    return bool(got == want)


@pytest.mark.parametrize(
    ("compiled", "numpy_path"),
    [(True, True), (False, True), (False, False)],
    ids=["compiled", "numpy", "no-numpy"],
)
def test_every_field_equals_the_reference(
    spark: SparkSession,
    landing: Path,
    tmp_path: Path,
    compiled: bool,
    numpy_path: bool,
) -> None:
    from p2p.telemetry._job import Options, run

    opts = Options(
        str(landing),
        str(tmp_path / "out"),
        window=WIDTH,
        since=SINCE,
        until=UNTIL,
        report=False,
        progress=False,
        partitions=3,
        batch=numpy_path,
        compiled=compiled,
    )
    summary = run(opts, spark=spark)
    got, want = job_tables(spark, tmp_path / "out"), reference(landing)
    for name, rows in want.items():
        assert len(got[name]) == len(rows), name
        for g, w in zip(got[name], rows, strict=True):
            assert len(g) == len(w), name
            bad = [i for i, (a, b) in enumerate(zip(g, w, strict=True)) if not same(a, b)]
            assert not bad, (name, [(i, g[i], w[i]) for i in bad], w[0])
    reasons = Counter(row[2] for row in want["quarantine"])
    assert summary["by_reason"] == dict(reasons)
    assert {"undecodable", "oversize", "schema_version", "invalid", "misplaced"} <= set(reasons)
    assert summary["duplicates_dropped"] == sum(row[-2] for row in want["devices"])
    assert summary["duplicates_conflicting"] >= 1
    assert summary["outside_range"] >= 2
    assert len(want["quarantine"]) >= 17

"""End to end: real nodes publish, spool, upload to a collector; the Spark job aggregates.

The job's per-topic and per-device aggregates are checked against values
computed here, independently, from the same landing files.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import trio
from _telemetry import landed

from edge_examples.telemetry_demo import run_fleet

pytestmark = pytest.mark.slow


def test_real_fleet_to_spark_aggregates(tmp_path: Path) -> None:
    from p2p.telemetry._job import Options, run
    from p2p.telemetry._spark import spark_session

    landed_run = trio.run(run_fleet, tmp_path, 3, 4.0)
    recs = landed(tmp_path / "landing")
    assert landed_run.records == len(recs) > 0
    assert landed_run.devices == 3
    spark = spark_session("local[2]", driver_memory="1g", shuffle_partitions=4)
    try:
        opts = Options(str(tmp_path / "landing"), str(tmp_path / "out"), window=5.0,
                       report=True, progress=False)  # fmt: skip
        summary = run(opts, spark)
        topics = {r["topic"]: r for r in (r.asDict() for r in spark.read.parquet(
            str(tmp_path / "out" / "topics")).collect())}  # fmt: skip
        devices = {r["device"]: r for r in (r.asDict() for r in spark.read.parquet(
            str(tmp_path / "out" / "devices")).collect())}  # fmt: skip
    finally:
        spark.stop()
    assert summary["records_read"] == len(recs)
    assert summary["quarantined"] == 0
    assert summary["by_kind"] == dict(Counter(r["kind"] for r in recs))
    pubs: Counter[str] = Counter()
    dels: Counter[str] = Counter()
    for r in recs:
        if r["kind"] == "topic":
            pubs[r["topic"]] += r["publications"]
            dels[r["topic"]] += r["deliveries"]
    assert {t: (row["publications"], row["deliveries"]) for t, row in topics.items()} == {
        t: (pubs[t], dels[t]) for t in pubs
    }
    assert sum(pubs.values()) > 0
    per_device = Counter(r["device"] for r in recs)
    assert {d: row["records"] for d, row in devices.items()} == dict(per_device)
    assert (tmp_path / "out" / "report.html").stat().st_size > 1000

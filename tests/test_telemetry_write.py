"""The driver's Parquet writer (pyarrow) against Spark's: the same rows and column types
when Spark reads the tables back."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from p2p.telemetry._generate import generate

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    if not os.environ.get("CI") and importlib.util.find_spec("pyspark") is None:
        pytest.skip("the spark extra is not installed (pip install 'vcube-ps[spark]')")
    from p2p.telemetry._spark import spark_session

    session = spark_session("local[2]", driver_memory="1g", shuffle_partitions=4)
    yield session
    session.stop()


def read_back(spark: SparkSession, out: Path, name: str) -> tuple[Any, list[tuple[Any, ...]]]:
    df = spark.read.parquet(str(out / name))
    types = [(f.name, f.dataType.simpleString()) for f in df.schema.fields]
    return types, [tuple(row) for row in df.collect()]


def test_pyarrow_and_spark_write_the_same_tables(spark: SparkSession, tmp_path: Path) -> None:
    from p2p.telemetry._job import Options, run
    from p2p.telemetry._tables import TABLES, _schemas, write_tables

    landing = tmp_path / "landing"
    generate(landing, devices=3, hours=2, seed=3, jobs=1)
    summary = run(Options(str(landing), str(tmp_path / "job"), report=False, progress=False),
                  spark=spark)  # fmt: skip
    assert summary["tables_written_by"] == "pyarrow"
    schemas = _schemas()
    tables = {}
    for name in TABLES:
        types, rows = read_back(spark, tmp_path / "job", name)
        assert types == [(f.name, f.dataType.simpleString()) for f in schemas[name].fields]
        tables[name] = rows
    assert tables["windows"]
    assert tables["quarantine"]
    assert write_tables(spark, str(tmp_path / "arrow"), tables, schemas) == "pyarrow"
    assert write_tables(spark, str(tmp_path / "spark"), tables, schemas, arrow=False) == "spark"
    for name in TABLES:
        by_arrow = read_back(spark, tmp_path / "arrow", name)
        assert by_arrow == read_back(spark, tmp_path / "spark", name)
        assert by_arrow[1] == tables[name]

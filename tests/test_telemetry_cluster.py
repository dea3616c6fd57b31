"""Spark jobs that work anywhere: a real standalone cluster, scrubbed environments, relative paths.

The cluster test starts a real Spark master and worker as local processes
(bound to 127.0.0.1) and runs the real ``p2p telemetry aggregate`` CLI
against it in an environment holding only PATH, HOME and LANG, with
relative paths, then compares every table with a local-mode run.  The
executors start the system ``python3`` (not this venv's), so the run only
works if the job ships what they import.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import cbor2
import pytest

from p2p.telemetry._generate import generate
from p2p.telemetry._spark import BUNDLE, _loopback_master, _placement, absolute, executor_bundle

SPARK_REQUIRED = bool(os.environ.get("CI") or os.environ.get("P2P_REQUIRE_SPARK"))
P2P = str(Path(sys.executable).with_name("p2p"))
TABLES = ("devices", "topics", "windows", "fleet", "timeline", "quarantine")


def scrubbed() -> dict[str, str]:
    """What ``.ci/run`` leaves: PATH (without this venv), HOME and LANG."""
    venv = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv)
    return {"PATH": path, "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}


def needs_spark() -> None:
    if not SPARK_REQUIRED and importlib.util.find_spec("pyspark") is None:
        pytest.skip("the spark extra is not installed (pip install 'vcube-ps[spark]')")


def aggregate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [P2P, "telemetry", "aggregate", *args, "--quiet"]
    return subprocess.run(cmd, cwd=cwd, env=scrubbed(), capture_output=True, text=True, timeout=600)


def tables(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Every table of an OUT_DIR, rows as dicts in file order (read with Spark, local[1])."""
    from p2p.telemetry._spark import spark_session

    spark = spark_session("local[1]", driver_memory="1g")
    try:
        return {
            name: [r.asDict() for r in spark.read.parquet(str(out / name)).collect()]
            for name in TABLES
        }
    finally:
        spark.stop()


def without_paths(rows: list[dict[str, Any]], root: Path) -> list[dict[str, Any]]:
    return [{k: (v.replace(str(root), "<landing>") if k == "file" else v) for k, v in r.items()}
            for r in rows]  # fmt: skip


@pytest.mark.slow
def test_standalone_cluster_gives_the_local_tables(tmp_path: Path) -> None:
    needs_spark()
    from p2p.telemetry._standalone import standalone_cluster

    generate(tmp_path / "land", devices=6, hours=1, seed=5, jobs=1)
    local = aggregate(tmp_path, "land", "--out", "local", "--master", "local[2]")
    assert local.returncode == 0, local.stderr[-2000:]
    with standalone_cluster(workers=1, cores=1) as cluster:
        assert cluster.url.startswith("spark://127.0.0.1:")
        remote = aggregate(tmp_path, "land", "--out", "remote", "--master", cluster.url)
    assert remote.returncode == 0, remote.stderr[-2000:]
    assert "Traceback" not in remote.stderr
    assert remote.stdout.replace("remote", "local") == local.stdout
    got, want = tables(tmp_path / "remote"), tables(tmp_path / "local")
    land = tmp_path / "land"
    for name in TABLES:
        assert without_paths(got[name], land) == without_paths(want[name], land), name
    assert sum(len(rows) for rows in want.values()) > 50


@pytest.mark.slow
def test_a_run_that_keeps_nothing_fails_with_the_reason(tmp_path: Path) -> None:
    needs_spark()
    folder = tmp_path / "land" / "date=2026-03-02" / "device=00000000000000aa"
    folder.mkdir(parents=True)
    (folder / "00000000-000000000000.cbor").write_bytes(cbor2.dumps({"v": 7}) + b"\xff\x00")
    bad = aggregate(tmp_path, "land", "--out", "out", "--no-report")
    assert bad.returncode != 0
    lines = [line for line in bad.stderr.splitlines() if line.startswith("p2p: error:")]
    assert len(lines) == 1, bad.stderr[-2000:]
    assert "all 2 items were quarantined" in lines[0]
    assert "schema_version" in lines[0]
    assert "undecodable" in lines[0]
    assert "Traceback" not in bad.stderr
    (folder / "00000000-000000000000.cbor").write_bytes(b"")
    empty = aggregate(tmp_path, "land", "--out", "out2", "--no-report")
    assert empty.returncode != 0
    assert "no record was read" in empty.stderr, empty.stderr[-2000:]


def test_paths_reach_executors_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert absolute("land") == str(tmp_path / "land")
    assert absolute("./a/../land/") == str(tmp_path / "land")
    assert absolute("file://land") == f"file://{tmp_path / 'land'}"
    assert absolute("/abs/land") == "/abs/land"
    assert absolute("hdfs://nn:8020/land") == "hdfs://nn:8020/land"


def test_local_mode_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP"):
        monkeypatch.delenv(name, raising=False)
    conf = _placement("local[2]", {})
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert conf["spark.driver.bindAddress"] == conf["spark.driver.host"] == "127.0.0.1"
    # what the user configured wins
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/py/bin/python3")
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.1.2.3")
    assert _placement("local[*]", {}) == {}
    assert os.environ["PYSPARK_PYTHON"] == "/opt/py/bin/python3"
    _placement("local", {"spark.pyspark.python": "/x/python"})
    assert os.environ["PYSPARK_PYTHON"] == "/x/python"
    # a cluster: the workers' own python3, the driver where Spark puts it
    monkeypatch.delenv("PYSPARK_PYTHON")
    monkeypatch.delenv("SPARK_LOCAL_IP")
    assert _placement("spark://10.0.0.5:7077", {}) == {}
    assert "PYSPARK_PYTHON" not in os.environ
    assert _placement("spark://127.0.0.1:7077", {})["spark.driver.host"] == "127.0.0.1"


def test_loopback_masters() -> None:
    assert _loopback_master("spark://127.0.0.1:7077")
    assert _loopback_master("spark://127.3.0.9:1")
    assert _loopback_master("spark://localhost:7077")
    assert _loopback_master("spark://[::1]:7077")
    assert not _loopback_master("spark://10.0.0.5:7077")
    assert not _loopback_master("spark://spark-master:7077")
    assert not _loopback_master("yarn")


def test_executor_bundle_holds_what_executors_import(tmp_path: Path) -> None:
    bundle = executor_bundle(tmp_path)
    assert bundle.name == f"{BUNDLE}.zip"
    names = set(zipfile.ZipFile(bundle).namelist())
    assert {"p2p/__init__.py", "p2p/_errors.py", "p2p/telemetry/_job.py"} <= names
    assert "cbor2/__init__.py" in names
    assert any(n.startswith("cbor2/_cbor2") for n in names)  # cbor2 6 is compiled only
    assert not any("__pycache__" in n for n in names)
    # what the executors do: import the job from the unpacked bundle, nothing else
    zipfile.ZipFile(bundle).extractall(tmp_path / BUNDLE)
    code = "import p2p.telemetry._job as j, cbor2; print(j.__file__, cbor2.__file__)"
    env = {**scrubbed(), "PYTHONPATH": BUNDLE, "PYTHONNOUSERSITE": "1"}
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout.split() == [
        str(tmp_path / BUNDLE / "p2p" / "telemetry" / "_job.py"),
        str(tmp_path / BUNDLE / "cbor2" / "__init__.py"),
    ]

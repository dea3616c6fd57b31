"""The one place that builds SparkSessions: the job's, the report's and the tests'.

Local mode (``local``, ``local[N]``, ``local[*]``)
    The Python workers run the driver's interpreter (``sys.executable``)
    unless the user chose one (``PYSPARK_PYTHON`` in the environment, or
    ``spark.pyspark.python`` passed in ``extra``), so they import exactly
    what the driver imports.  The driver binds to loopback unless
    ``SPARK_LOCAL_IP`` says otherwise.

A cluster (``spark://``, ``yarn``, ``k8s://`` ...)
    The driver's interpreter path need not exist on the workers, so the job
    ships what its executors import: one archive holding ``p2p.telemetry``
    (with the small ``p2p`` root it needs) and the installed ``cbor2``
    package, unpacked by Spark in every executor's working directory and
    put first on the workers' ``PYTHONPATH``.  cbor2 6 is a compiled
    extension only (it has no pure-Python fallback), so a worker needs
    Java 17+ and a CPython of the driver's minor version on the driver's
    OS and architecture (``python3`` on its PATH, or ``PYSPARK_PYTHON``);
    nothing has to be installed with pip.  A master on a loopback address
    means the whole cluster is on this host: the driver binds to loopback
    too (unless ``SPARK_LOCAL_IP`` is set).

Paths given by the user are made absolute here (:func:`absolute`) before
any of them reaches an executor, whose working directory is not the
driver's.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from p2p.telemetry._schema import TelemetryError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SPARK_MISSING = "install the spark extra: pip install 'vcube-ps[spark]'"
BUNDLE = "p2p_executor"
"""Name of the archive shipped to executors and of the folder Spark unpacks it into."""
LOOPBACK = "127.0.0.1"


# ------------------------------------------------------------------ paths


def scheme(path: str) -> str | None:
    """The URI scheme of ``path`` (lower case), or ``None`` for a plain path."""
    match = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]*)://", path)
    return None if match is None else match.group(1).lower()


def is_uri(path: str) -> bool:
    """Read through Hadoop (``binaryFiles``): any ``scheme://`` path, ``file://`` included."""
    return scheme(path) is not None


def local_path(path: str) -> str:
    """``path`` without a ``file://`` prefix."""
    return path[len("file://") :] if path.startswith("file://") else path


def absolute(path: str) -> str:
    """``path`` as executors must see it: a plain path made absolute against the driver's
    working directory (``file://`` paths too); any other URI is returned unchanged."""
    kind = scheme(path)
    if kind is None:
        return os.path.abspath(path)
    if kind == "file":
        return "file://" + os.path.abspath(local_path(path))
    return path


def write_text(out: str, name: str, text: str) -> None:
    """A driver-side file in OUT_DIR (a local or shared path), replaced atomically."""
    if scheme(out) not in (None, "file"):
        raise TelemetryError(f"cannot write {name} to {out}: OUT_DIR must be a local/shared path")
    path = Path(local_path(out))
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f".{name}.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path / name)


# ------------------------------------------------------------------ spark


def require_pyspark() -> Any:
    """The ``pyspark`` module, or :class:`TelemetryError` saying how to install it."""
    try:
        import pyspark
    except ImportError:
        raise TelemetryError(SPARK_MISSING) from None
    return pyspark


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def _loopback_master(master: str) -> bool:
    """``spark://127.0.0.1:7077`` (or ``localhost``, or ``::1``): a cluster on this host."""
    match = re.match(r"spark://\[?([^\]/]+?)\]?:\d+$", master)
    if match is None:
        return False
    host = match.group(1)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _placement(master: str, extra: dict[str, str]) -> dict[str, str]:
    """Where the driver binds and which Python local workers run (see the module doc)."""
    conf: dict[str, str] = {}
    if "SPARK_LOCAL_IP" not in os.environ and (is_local(master) or _loopback_master(master)):
        # The variable for the JVM this process launches (its block manager and RPC
        # bind to it), the settings for the address the driver advertises.
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
        conf["spark.driver.bindAddress"] = LOOPBACK
        conf["spark.driver.host"] = LOOPBACK
    if is_local(master):
        # PySpark reads the workers' interpreter from this variable only (not from the conf).
        chosen = extra.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
        os.environ["PYSPARK_PYTHON"] = chosen or sys.executable
    return conf


def _local_jvm(master: str) -> dict[str, str]:
    """In local mode the one JVM only schedules tasks and passes their results on (the
    records are read and folded in Python), so it starts with the quick compiler only and
    the serial collector: about 1-1.5 s less start-up on 2 cores.  ``extra`` may override."""
    if not is_local(master):
        return {}
    return {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


def executor_bundle(folder: Path) -> Path:
    """``folder/p2p_executor.zip``: what executors import (``p2p.telemetry``, the
    ``p2p`` modules it imports: the package root, its errors and the percentile
    rule, the lazy-export helper the root takes from ``vcube`` (``vcube/__init__``
    and ``vcube/_lazy``, which load nothing else), and the installed cbor2
    package with its compiled extension)."""
    import cbor2

    root = Path(__file__).resolve().parents[2]
    target = folder / f"{BUNDLE}.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel in (
            "p2p/__init__.py",
            "p2p/_errors.py",
            "p2p/_stats.py",
            "vcube/__init__.py",
            "vcube/_lazy.py",
        ):
            zf.write(root / rel, rel)
        for py in sorted((root / "p2p" / "telemetry").glob("*.py")):
            zf.write(py, f"p2p/telemetry/{py.name}")
        package = Path(cbor2.__file__).parent
        for f in sorted(package.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                zf.write(f, f"cbor2/{f.relative_to(package).as_posix()}")
    return target


def _shipping(master: str, extra: dict[str, str]) -> dict[str, str]:
    """On a cluster: the executor bundle as a Spark archive, first on the workers' path."""
    if is_local(master):
        return {}
    folder = Path(tempfile.mkdtemp(prefix="p2p-telemetry-"))
    atexit.register(shutil.rmtree, folder, True)  # Spark has copied it by then
    bundle = executor_bundle(folder)
    archives = ",".join(a for a in (extra.get("spark.archives"), f"{bundle}#{BUNDLE}") if a)
    path = ":".join(p for p in (BUNDLE, extra.get("spark.executorEnv.PYTHONPATH")) if p)
    return {"spark.archives": archives, "spark.executorEnv.PYTHONPATH": path}


def spark_session(
    master: str = "local[*]",
    *,
    driver_memory: str = "2g",
    ui: bool = False,
    shuffle_partitions: int | None = None,
    extra: dict[str, str] | None = None,
    app: str = "p2p-telemetry",
) -> SparkSession:
    """A new SparkSession on ``master`` placed and provisioned as the module doc says.

    ``extra`` settings win over the defaults here.  Raises :class:`TelemetryError`
    (one line) when PySpark is missing or Spark cannot start.
    """
    require_pyspark()
    from pyspark.sql import SparkSession

    extra = dict(extra or {})
    cores = os.cpu_count() or 2
    conf = {
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": driver_memory,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions or max(4, 2 * cores)),
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.python.worker.reuse": "true",
        **_local_jvm(master),
        **_placement(master, extra),
        **extra,
        **_shipping(master, extra),
    }
    builder: Any = SparkSession.builder.master(master).appName(app)
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark: SparkSession = builder.getOrCreate()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise TelemetryError(
            f"could not start Spark (master {master}; is Java 17+ installed and JAVA_HOME "
            f"set?): {first}"
        ) from exc
    spark.sparkContext.setLogLevel("WARN")
    return spark


__all__ = [
    "BUNDLE",
    "SPARK_MISSING",
    "absolute",
    "executor_bundle",
    "is_local",
    "is_uri",
    "local_path",
    "require_pyspark",
    "scheme",
    "spark_session",
    "write_text",
]

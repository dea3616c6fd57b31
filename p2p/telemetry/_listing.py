"""Landing files: listing them (a local path or any Hadoop URI), spreading devices over
tasks, and scanning a file's CBOR items with their byte offsets."""

from __future__ import annotations

import datetime as dt
import io
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cbor2

from p2p.telemetry._schema import (
    MAX_RECORD_BYTES,
    TelemetryError,
)
from p2p.telemetry._spark import local_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LAYOUT = re.compile(r"date=(\d{4}-\d{2}-\d{2}|unknown)/device=([0-9a-f]{16})/(\d+)-(\d+)\.cbor")
"""A landing file's path below LANDING_DIR."""
REASONS = ("undecodable", "oversize", "schema_version", "invalid", "misplaced", "unreadable")
"""Why an item is quarantined."""


@dataclass(frozen=True, slots=True)
class LandingFile:
    path: str
    size: int
    date: str
    device: str
    boot: int
    seq: int


def scan(data: bytes, start: int = 0) -> Iterator[tuple[int, int, object, str | None]]:
    """:func:`~p2p.telemetry.iter_items` with byte offsets: ``(start, end, item, error)``,
    from byte ``start`` on (an item boundary).

    Same rules (a corrupt item ends the file, an item over ``MAX_RECORD_BYTES``
    is an error and scanning goes on), and any decoder exception is a corrupt
    item rather than a crash.
    """
    stream = io.BytesIO(data)
    stream.seek(start)
    decoder = cbor2.CBORDecoder(stream)
    size = len(data)
    while stream.tell() < size:
        start = stream.tell()
        try:
            item = decoder.decode()
        except Exception as exc:  # iter_items: CBORDecodeError, ValueError, EOFError, ...
            yield start, size, None, f"undecodable CBOR at byte {start}: {exc}"[:300]
            return
        end = stream.tell()
        if end - start > MAX_RECORD_BYTES:
            yield start, end, None, f"record at byte {start} exceeds {MAX_RECORD_BYTES} bytes"
            continue
        yield start, end, item, None


def classify(error: str, decoded: bool) -> tuple[str, str]:
    """``(reason, field)`` of a bad item from its error message."""
    if not decoded:
        return ("oversize" if "exceeds" in error else "undecodable"), ""
    if error.startswith("v:"):
        return "schema_version", "v"
    if error.startswith("unknown keys"):
        return "invalid", "unknown_keys"
    return "invalid", error.split(":", 1)[0][:40]


# ---------------------------------------------------------------- listing


def list_landing(
    landing: str, since: float | None = None
) -> tuple[list[LandingFile], list[str], int]:
    """Landing files under a local ``landing`` dir: ``(files, skipped, pruned)``."""
    root = Path(local_path(landing))
    if not root.is_dir():
        raise TelemetryError(f"landing directory {landing} does not exist")
    files: list[LandingFile] = []
    skipped: list[str] = []
    pruned = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("_", ".")))
        for name in sorted(filenames):
            if name.startswith(("_", ".")) or name.endswith(".tmp"):
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            lf = _landing_file(full, rel, os.path.getsize(full))
            pruned += _triage(lf, rel, since, files, skipped)
    return files, skipped, pruned


def _landing_file(full: str, rel: str, size: int) -> LandingFile | None:
    m = LAYOUT.fullmatch(rel)
    if m is None:
        return None
    return LandingFile(full, size, m.group(1), m.group(2), int(m.group(3)), int(m.group(4)))


def _triage(
    lf: LandingFile | None,
    rel: str,
    since: float | None,
    files: list[LandingFile],
    skipped: list[str],
) -> int:
    """File a listed path: not a landing file (``skipped``), before ``--since`` (returns 1,
    pruned), or one to read (``files``)."""
    if lf is None:
        skipped.append(rel)
        return 0
    if _pruned(lf.date, since):
        return 1
    files.append(lf)
    return 0


def _pruned(date: str, since: float | None) -> bool:
    if since is None or date == "unknown":
        return False
    day = dt.datetime.fromisoformat(date).replace(tzinfo=dt.UTC).timestamp()
    return day + 2 * 86400 <= since


def _list_uri(
    spark: SparkSession, landing: str, since: float | None
) -> tuple[list[LandingFile], list[str], int]:
    """The same listing through the Hadoop FileSystem (any URI Spark can read)."""
    jvm: Any = spark.sparkContext._jvm
    jsc: Any = spark.sparkContext._jsc
    base = landing.rstrip("/")
    path = jvm.org.apache.hadoop.fs.Path(base)
    fs = path.getFileSystem(jsc.hadoopConfiguration())
    if not fs.exists(path):
        raise TelemetryError(f"landing directory {landing} does not exist")
    root = fs.makeQualified(path).toString().rstrip("/")
    statuses = fs.globStatus(jvm.org.apache.hadoop.fs.Path(base + "/date=*/device=*/*")) or []
    files: list[LandingFile] = []
    skipped: list[str] = []
    pruned = 0
    for st in statuses:
        full = st.getPath().toString()
        rel = full[len(root) + 1 :] if full.startswith(root + "/") else full
        name = rel.rsplit("/", 1)[-1]
        if st.isDirectory() or name.startswith(("_", ".")) or name.endswith(".tmp"):
            continue
        lf = _landing_file(full, rel, int(st.getLen()))
        pruned += _triage(lf, rel, since, files, skipped)
    return sorted(files, key=lambda f: f.path), sorted(skipped), pruned


def spread(files: list[LandingFile], tasks: int) -> list[list[tuple[str, list[LandingFile]]]]:
    """Devices (with all their files) spread over ``tasks`` bins by bytes, largest first."""
    by_device: dict[str, list[LandingFile]] = {}
    for f in files:
        by_device.setdefault(f.device, []).append(f)
    bins: list[list[tuple[str, list[LandingFile]]]] = [[] for _ in range(tasks)]
    load = [0] * tasks
    weight = {d: sum(f.size for f in fs) + 1 for d, fs in by_device.items()}
    for device in sorted(by_device, key=lambda d: (-weight[d], d)):
        i = min(range(tasks), key=lambda k: (load[k], k))
        bins[i].append((device, by_device[device]))
        load[i] += weight[device]
    return [b for b in bins if b]

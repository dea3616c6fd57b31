"""The synthetic telemetry generator: landing layout, determinism, corruption rates, load shape."""

from __future__ import annotations

import datetime as dt
import itertools
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import cbor2
import pytest

from p2p.telemetry import TelemetryError, iter_items, validate
from p2p.telemetry._generate import (
    DEFAULT_START,
    P_INVALID,
    P_VERSION,
    generate,
    load,
    topic_catalogue,
)

NAME = re.compile(r"date=(\d{4}-\d{2}-\d{2})/device=([0-9a-f]{16})/(\d{8})-(\d{12})\.cbor")


def tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def decode(root: Path) -> tuple[Counter[str], list[tuple[str, dict[str, Any]]]]:
    """Counts by outcome, and the valid records with their file (relative path)."""
    counts: Counter[str] = Counter()
    valid = []
    for rel, data in tree(root).items():
        for item, err in iter_items(data):
            if err is not None:
                counts["undecodable"] += 1
                continue
            try:
                valid.append((rel, validate(item)))
            except TelemetryError as exc:
                counts["bad_version" if str(exc).startswith("v:") else "invalid"] += 1
    counts["valid"] = len(valid)
    return counts, valid


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """12 devices x 24 h (about 100k records), shared by the shape tests."""
    out = tmp_path_factory.mktemp("gen") / "landing"
    return out, generate(out, devices=12, hours=24, seed=11, jobs=2)


@pytest.fixture(scope="module")
def decoded(
    day: tuple[Path, dict[str, Any]],
) -> tuple[Counter[str], list[tuple[str, dict[str, Any]]]]:
    return decode(day[0])


def test_layout_and_records(day: tuple[Path, dict[str, Any]]) -> None:
    root, stats = day
    files = tree(root)
    assert len(files) == stats["files"]
    assert sum(map(len, files.values())) == stats["bytes"]
    devices = set()
    for rel, data in files.items():
        m = NAME.fullmatch(rel)
        assert m, rel
        date, device, boot, first = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
        devices.add(device)
        items = [item for item, err in iter_items(data) if err is None]
        assert isinstance(items[0], dict)
        assert (items[0]["boot"], items[0]["seq"]) == (boot, first)
        seqs = []
        for item in items:
            assert isinstance(item, dict)
            assert item["device"] == device
            assert item["boot"] == boot
            day_of_t = dt.datetime.fromtimestamp(item["t"], dt.UTC).date().isoformat()
            assert day_of_t == date
            seqs.append(item["seq"])
        assert seqs == sorted(seqs)
    assert len(devices) == 12


def test_counts_match_what_was_injected(
    day: tuple[Path, dict[str, Any]],
    decoded: tuple[Counter[str], list[tuple[str, dict[str, Any]]]],
) -> None:
    stats = day[1]
    counts, valid = decoded
    assert counts["undecodable"] == stats["torn"]
    assert counts["invalid"] == stats["invalid"] + stats["duplicated_invalid"]
    assert counts["bad_version"] == stats["bad_version"] + stats["duplicated_bad_version"]
    items = counts["valid"] + counts["invalid"] + counts["bad_version"]
    assert items == stats["records"] + stats["duplicates"]
    ids = Counter(rec["id"] for _, rec in valid)
    dup_valid = sum(n - 1 for n in ids.values())
    dup_corrupt = stats["duplicated_invalid"] + stats["duplicated_bad_version"]
    assert dup_valid == stats["duplicates"] - dup_corrupt
    # documented rates, loosely: ~0.05 % invalid, ~0.02 % wrong version
    n = stats["records"]
    assert 0.3 * P_INVALID * n <= stats["invalid"] <= 3 * P_INVALID * n
    assert stats["bad_version"] <= 4 * P_VERSION * n + 5
    assert 0 < counts["invalid"] + counts["bad_version"] < 0.005 * n
    # about one record per 10 s per device
    assert 0.85 * 8640 * 12 <= n <= 1.15 * 8640 * 12
    for _, rec in valid:
        if rec["kind"] == "topic":
            assert sum(rec["latency"]) == rec["deliveries"]
            assert sum(rec["holdback"]) == rec["held"]
            assert sum(rec["ack_round"]) == rec["publications"]


def test_diurnal_load_and_skewed_topics(
    decoded: tuple[Counter[str], list[tuple[str, dict[str, Any]]]],
) -> None:
    valid = decoded[1]
    per_hour: Counter[int] = Counter()
    deliveries: Counter[str] = Counter()
    for _, rec in valid:
        if rec["kind"] == "topic":
            per_hour[int(rec["t"] % 86400 // 3600)] += 1
            deliveries[rec["topic"]] += rec["deliveries"]
    peak = sum(per_hour[h] for h in range(13, 18))
    trough = sum(per_hour[h] for h in range(1, 6))
    assert peak > 1.5 * trough, per_hour
    assert max(load(h * 3600.0) for h in range(24)) == pytest.approx(1.6, abs=0.01)
    ranked = [t for t, _ in deliveries.most_common()]
    total = sum(deliveries.values())
    top = sum(deliveries[t] for t in ranked[: max(1, len(ranked) // 10)])
    assert top > 0.3 * total  # the hottest tenth carries far more than a tenth
    hottest = topic_catalogue(11)[:3]
    assert ranked[0] in hottest


def test_deterministic_by_seed_whatever_the_jobs(tmp_path: Path) -> None:
    kw: dict[str, Any] = {"devices": 5, "hours": 1.5, "seed": 3}
    a = generate(tmp_path / "a", jobs=1, **kw)
    b = generate(tmp_path / "b", jobs=2, **kw)
    c = generate(tmp_path / "c", jobs=1, **{**kw, "seed": 4})
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    assert {k: v for k, v in a.items() if k != "seconds"} == {
        k: v for k, v in b.items() if k != "seconds"
    }
    assert tree(tmp_path / "a") != tree(tmp_path / "c")
    assert c["records"] > 0


def test_histogram_splice_is_canonical_cbor(tmp_path: Path) -> None:
    """Topic records are assembled from pre-encoded histograms: the bytes must be cbor2's."""
    generate(tmp_path / "g", devices=2, hours=0.5, seed=9, jobs=1)
    checked = 0
    for data in tree(tmp_path / "g").values():
        items = [item for item, err in iter_items(data) if err is None]
        if b"".join(cbor2.dumps(item) for item in items) == data:
            checked += 1
        else:  # only a torn tail may differ
            assert any(err for _, err in iter_items(data))
    assert checked >= 1


def test_start_and_crash_lifecycle(tmp_path: Path) -> None:
    """Every boot after the first starts with a start event; crashes precede a new boot."""
    start = DEFAULT_START.timestamp()
    generate(tmp_path / "g", devices=60, hours=3, seed=2, jobs=2, start=start)
    _, valid = decode(tmp_path / "g")
    by_device: dict[str, list[dict[str, Any]]] = {}
    for _, rec in valid:
        by_device.setdefault(rec["device"], []).append(rec)
    crashes = 0
    for recs in by_device.values():
        recs.sort(key=lambda r: (r["boot"], r["seq"]))
        for prev, rec in itertools.pairwise(recs):
            if rec["boot"] != prev["boot"]:
                assert rec["seq"] == 0, rec
                assert rec.get("event") == "start", rec
        crashes += sum(r.get("event") == "crash" for r in recs)
        assert all(start < r["t"] <= start + 3 * 3600 + 60 for r in recs)
    assert crashes >= 1  # 60 devices: ~2 crash-prone


def test_refuses_a_non_empty_directory_and_bad_arguments(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(TelemetryError, match="not an empty directory"):
        generate(tmp_path, devices=1, hours=1)
    with pytest.raises(TelemetryError, match="--devices"):
        generate(tmp_path / "n", devices=0, hours=1)
    with pytest.raises(TelemetryError, match="--hours"):
        generate(tmp_path / "n", devices=1, hours=0)
    assert (tmp_path / "x").read_text() == "keep me"


def test_cli_generate(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "p2p.telemetry._cli", "telemetry", "generate"]
    ok = subprocess.run(
        [*cmd, "--devices", "2", "--hours", "0.25", "--out", str(tmp_path / "l"), "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert '"records":' in ok.stdout
    bad = subprocess.run(
        [*cmd, "--devices", "2", "--hours", "1", "--out", str(tmp_path / "l")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("p2p: error:")
    assert "not an empty directory" in bad.stderr

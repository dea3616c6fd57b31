"""The sensor-node example: host readings, the wire format of a reading, the service loop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _telemetry import landed, read_records

from edge_examples.sensor import (
    MAX_READING,
    Reading,
    SimulatedThermometer,
    cpu_temperature,
    format_table,
    memory_used_pct,
)
from p2p._identity import add_node, init_fleet, load_node


def test_reading_round_trips_and_rejects_garbage() -> None:
    r = Reading("attic", 1700000000.5, 47.25, 0.5, 33.3, simulated=True)
    assert Reading.decode(r.encode()) == r
    good = json.loads(r.encode())
    bad = [
        b"[]",
        json.dumps({**good, "extra": 1}).encode(),
        json.dumps({**good, "temp_c": "hot"}).encode(),
        json.dumps({**good, "load1": True}).encode(),
        json.dumps({**good, "device": 7}).encode(),
        b"x" * (MAX_READING + 1),
    ]
    for data in bad:
        with pytest.raises(ValueError):  # noqa: PT011 - json errors are ValueErrors too
            Reading.decode(data)


def test_cpu_temperature_reads_the_first_readable_zone(tmp_path: Path) -> None:
    assert cpu_temperature(tmp_path) is None
    (tmp_path / "thermal_zone0").mkdir()
    (tmp_path / "thermal_zone0" / "temp").write_text("garbage\n")
    (tmp_path / "thermal_zone1").mkdir()
    (tmp_path / "thermal_zone1" / "temp").write_text("45123\n")
    assert cpu_temperature(tmp_path) == pytest.approx(45.123)


def test_memory_used_pct(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  1000 kB\nMemFree: 100 kB\nMemAvailable:  250 kB\n")
    assert memory_used_pct(meminfo) == 75.0
    assert memory_used_pct(tmp_path / "missing") == 0.0


def test_simulated_thermometer_is_seeded_and_plausible() -> None:
    a, b = SimulatedThermometer(7), SimulatedThermometer(7)
    temps = [a(t) for t in range(0, 3600, 60)]
    assert temps == [b(t) for t in range(0, 3600, 60)]
    assert all(30 < t < 65 for t in temps)


def test_format_table_marks_simulated_readings() -> None:
    latest = {
        "b": Reading("b", 10.0, 40.0, 1.0, 50.0, True),
        "a": Reading("a", 9.0, 41.0, 0, 1, False),
    }
    lines = format_table(latest, now=12.0).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["a", "b"]
    assert "40.0*" in lines[2]
    assert lines[1].split()[-1] == "3.0"


def test_demo_fleet_reports_every_device() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "edge_examples.sensor", "demo", "--duration", "3"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 devices reporting" in proc.stdout
    for device in ("greenhouse", "garage", "attic"):
        assert device in proc.stdout


def test_sensor_service_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """What systemd does on `systemctl stop`: SIGTERM, then a clean exit 0."""
    init_fleet(tmp_path / "fleet", psk=True)
    add_node(tmp_path / "fleet", tmp_path / "pi")
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge_examples.sensor", "run", "--identity", str(tmp_path / "pi"),
         "--interval", "0.2", "--settle", "0", "--seed", "127.0.0.1:9"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        while "publishing on" not in proc.stderr.readline():
            assert time.monotonic() < deadline, "sensor did not start"
            assert proc.poll() is None, "sensor exited early"
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=30)[1]
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert "stopped after" in err
    published = int(err.split("stopped after")[1].split()[0])
    assert published >= 2


def _sensor(node: Path, *options: str) -> list[str]:
    """``sensor run`` alone on loopback (no mDNS, a seed nobody listens on), fast readings."""
    return [sys.executable, "-m", "edge_examples.sensor", "run", "--identity", str(node),
            "--interval", "0.1", "--settle", "0", "--no-mdns", "--seed", "127.0.0.1:9",
            *options]  # fmt: skip


def _published(stderr: str) -> int:
    """The count in the sensor's last log line, ``stopped after N readings``."""
    assert "stopped after" in stderr, stderr
    return int(stderr.split("stopped after")[1].split()[0])


def _check_spool(records: list[dict[str, Any]], node: Path, published: int) -> None:
    """One boot of this device: start, node and topic windows, stop; every reading counted."""
    device = f"{load_node(node)[0].node_id:016x}"
    assert {r["device"] for r in records} == {device}
    events = [r["event"] for r in records if r["kind"] == "event"]
    assert events == ["start", "stop"]
    assert any(r["kind"] == "node" for r in records)
    topics = [r for r in records if r["kind"] == "topic"]
    assert {r["topic"] for r in topics} == {"sensors"}
    assert sum(r["publications"] for r in topics) == published
    assert sum(sum(r["ack_round"]) for r in topics) == published  # every reading acknowledged
    assert sum(r["deliveries"] for r in topics) == 0  # alone: its own readings do not count


def test_sensor_feeds_its_telemetry_spool(tmp_path: Path) -> None:
    """--telemetry: valid records whose publication counter is the readings published."""
    init_fleet(tmp_path / "fleet", psk=True)
    add_node(tmp_path / "fleet", tmp_path / "pi")
    spool = tmp_path / "spool"
    proc = subprocess.run(
        _sensor(tmp_path / "pi", "--count", "7", "--telemetry", str(spool)),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    published = _published(proc.stderr)
    assert published == 7
    assert not list(spool.glob("*.part")), "the spool was not closed cleanly"
    _check_spool(read_records(sorted(spool.glob("*.cbor"))), tmp_path / "pi", published)


def test_sensor_uploads_its_telemetry_to_a_collector(tmp_path: Path) -> None:
    """--collector: the whole spool lands in the collector's landing directory on stop."""
    init_fleet(tmp_path / "fleet", psk=True)
    for name in ("collector", "pi"):
        add_node(tmp_path / "fleet", tmp_path / name)
    landing, spool = tmp_path / "landing", tmp_path / "spool"
    collector = subprocess.Popen(
        [sys.executable, "-m", "p2p", "telemetry", "collect", str(landing),
         "--identity", str(tmp_path / "collector"), "--port", "0"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert collector.stderr is not None
        deadline = time.monotonic() + 60
        while "collecting on" not in (line := collector.stderr.readline()):
            assert time.monotonic() < deadline, "collector did not start"
            assert collector.poll() is None, "collector exited early"
        address = line.split("collecting on")[1].split()[0]
        proc = subprocess.run(
            _sensor(tmp_path / "pi", "--count", "4", "--telemetry", str(spool),
                    "--collector", address),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        collector.terminate()
        collector.communicate(timeout=30)
    assert proc.returncode == 0, proc.stderr
    _check_spool(landed(landing), tmp_path / "pi", _published(proc.stderr))
    left = list(spool.glob("*.cbor")) + list(spool.glob("*.part"))
    assert not left, "the final upload on a clean stop should have sent (and removed) these"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (["--collector", "127.0.0.1:7478"], "telemetry_collector needs telemetry_dir"),
        (["--telemetry", "SPOOL", "--collector", "nowhere"], "expected HOST:PORT"),
    ],
)
def test_sensor_rejects_a_bad_telemetry_setup(
    tmp_path: Path, options: list[str], error: str
) -> None:
    init_fleet(tmp_path / "fleet", psk=True)
    add_node(tmp_path / "fleet", tmp_path / "pi")
    options = [str(tmp_path / "spool") if o == "SPOOL" else o for o in options]
    proc = subprocess.run(
        _sensor(tmp_path / "pi", "--count", "1", *options),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert error in proc.stderr
    assert not (tmp_path / "spool").exists()

"""A Raspberry Pi style sensor node and a live dashboard, on the blocking API (no trio).

Sensor (one per device, fit for a systemd service: logs to stderr, stops
cleanly on SIGTERM, exits non-zero on a bad setup)::

    python -m edge_examples.sensor run --identity NODE_DIR --interface 192.168.1.31

Every ``--interval`` seconds it reads what the host offers (CPU temperature
from ``/sys/class/thermal``, load average, memory in use; a simulated
temperature when the host has no thermal zone) and publishes one reading on
``--topic`` (default ``sensors``).

Fleet telemetry (``docs/telemetry.md``): ``--telemetry SPOOL_DIR`` records the
node's counters and latency histograms there, one window every 10 s, and
``--collector HOST:PORT`` uploads the spool to a ``p2p telemetry collect``::

    python -m edge_examples.sensor run --identity NODE_DIR --interface 192.168.1.31 \
        --telemetry /var/lib/p2p-sensor/telemetry --collector 192.168.1.20:7478

The node options (``--port``, ``--seed``, ``--no-mdns``, ``--telemetry``,
``--collector``, ...) are those of ``p2p node``, parsed by the same code.

Dashboard (anywhere on the LAN)::

    python -m edge_examples.sensor dashboard --identity NODE_DIR --interface 192.168.1.20

prints the fleet's latest readings, one line per device, as they arrive.

Local demo (a throw-away fleet on 127.0.0.1: three sensors and a dashboard)::

    python -m edge_examples.sensor demo --duration 10
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from types import FrameType

from p2p import BlockingNode, BlockingSubscription, NodeConfig, P2PError
from p2p.cli import INTERRUPTED, add_node_options, finite, node_config, run_cli
from p2p.fleet import add_node, init_fleet

log = logging.getLogger("edge_examples.sensor")

THERMAL = Path("/sys/class/thermal")
MAX_READING = 1024
"""Largest reading payload accepted by the dashboard, in bytes."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One sample of a device; ``simulated`` says the temperature is not a real sensor's."""

    device: str
    time: float
    temp_c: float
    load1: float
    mem_used_pct: float
    simulated: bool

    def encode(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> Reading:
        """Parse a reading; ``ValueError`` on anything malformed (it comes from the network)."""
        if len(data) > MAX_READING:
            raise ValueError(f"reading of {len(data)} bytes exceeds {MAX_READING}")
        obj = json.loads(data)
        if not isinstance(obj, dict) or set(obj) != set(cls.__slots__):
            raise ValueError("reading: wrong fields")
        for name in ("time", "temp_c", "load1", "mem_used_pct"):
            if not isinstance(obj[name], int | float) or isinstance(obj[name], bool):
                raise ValueError(f"reading: {name} is not a number")
        if not isinstance(obj["device"], str) or not isinstance(obj["simulated"], bool):
            raise ValueError("reading: bad device or simulated flag")
        return cls(**obj)


# ------------------------------------------------------------------ the host


def cpu_temperature(root: Path = THERMAL) -> float | None:
    """Degrees Celsius of the first readable thermal zone, or ``None`` if there is none."""
    for zone in sorted(root.glob("thermal_zone*")):
        try:
            return int((zone / "temp").read_text().strip()) / 1000.0
        except (OSError, ValueError):
            continue
    return None


def memory_used_pct(meminfo: Path = Path("/proc/meminfo")) -> float:
    """Share of memory in use (``MemTotal - MemAvailable``), in percent; 0 if unknown."""
    fields: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            fields[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    total, avail = fields.get("MemTotal", 0), fields.get("MemAvailable", 0)
    return round(100.0 * (total - avail) / total, 1) if total else 0.0


class SimulatedThermometer:
    """A plausible CPU temperature: a slow daily-ish wave plus noise (seeded, so replayable)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.base = 45.0 + self.rng.uniform(-5, 5)

    def __call__(self, now: float) -> float:
        return round(self.base + 8 * math.sin(now / 600.0) + self.rng.gauss(0, 0.3), 2)


def read_host(device: str, now: float, simulated: Callable[[float], float]) -> Reading:
    """A reading of this host; the temperature is simulated only if no sensor exists."""
    temp = cpu_temperature()
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return Reading(
        device=device,
        time=now,
        temp_c=temp if temp is not None else simulated(now),
        load1=round(load1, 2),
        mem_used_pct=memory_used_pct(),
        simulated=temp is None,
    )


# ------------------------------------------------------------------ sensor


def run_sensor(
    node: BlockingNode,
    topic: str,
    device: str,
    interval: float,
    stop: threading.Event,
    count: int | None = None,
) -> int:
    """Publish one reading per ``interval`` until ``stop`` is set (or ``count`` readings).

    Returns the number published.  A reading the network cannot take right now
    is logged and the loop goes on: a sensor loop never dies of a network hiccup.
    """
    node.subscribe(topic, timeout=60)  # VCube-PS publishers are subscribers of their topic
    thermometer = SimulatedThermometer(seed=node.id)
    sent = 0
    while not stop.is_set() and (count is None or sent < count):
        reading = read_host(device, time.time(), thermometer)
        try:
            node.publish(topic, reading.encode(), timeout=max(interval, 1.0))
            sent += 1
        except (P2PError, TimeoutError) as exc:
            log.warning("reading not published: %s", exc)
        stop.wait(interval)
    return sent


# --------------------------------------------------------------- dashboard


def latest_readings(
    sub: BlockingSubscription, timeout: float, stop: threading.Event | None = None
) -> Iterator[dict[str, Reading]]:
    """The latest reading per device, after each new one; stops after ``timeout`` s of
    silence, or within half a second of ``stop`` being set.

    Malformed readings are logged and skipped (they come from the network).
    """
    latest: dict[str, Reading] = {}
    heard = time.monotonic()
    while stop is None or not stop.is_set():
        try:
            delivery = sub.get(timeout=min(0.5, timeout))
        except TimeoutError:
            if time.monotonic() - heard >= timeout:
                return
            continue
        if delivery is None:
            return
        heard = time.monotonic()
        try:
            reading = Reading.decode(delivery.payload)
        except ValueError as exc:
            log.warning("ignoring a reading from %016x: %s", delivery.source, exc)
            continue
        latest[reading.device] = reading
        yield dict(latest)


def format_table(latest: dict[str, Reading], now: float) -> str:
    """One line per device, sorted by name."""
    lines = [f"{'device':<16} {'temp °C':>8} {'load':>6} {'mem %':>6} {'age s':>6}"]
    for name in sorted(latest):
        r = latest[name]
        temp = f"{r.temp_c:.1f}{'*' if r.simulated else ''}"
        lines.append(
            f"{name:<16} {temp:>8} {r.load1:>6.2f} {r.mem_used_pct:>6.1f} {now - r.time:>6.1f}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------- CLI


def cmd_run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    signals = _on_signals(stop)
    device = args.device or args.identity.name
    config = node_config(args)
    with BlockingNode(args.identity, config) as node:
        log.info(
            "sensor %s (%016x) publishing on %r every %s s",
            device,
            node.id,
            args.topic,
            args.interval,
        )
        if config.telemetry_dir is not None:
            log.info(
                "telemetry to %s every %s s%s",
                config.telemetry_dir,
                config.telemetry_window,
                f", uploaded to {config.telemetry_collector}" if config.telemetry_collector else "",
            )
        stop.wait(args.settle)
        sent = run_sensor(node, args.topic, device, args.interval, stop, args.count)
    log.info("stopped after %d readings", sent)
    return _exit_code(signals)


def cmd_dashboard(args: argparse.Namespace) -> int:
    stop = threading.Event()
    signals = _on_signals(stop)
    with BlockingNode(args.identity, node_config(args)) as node:
        stop.wait(args.settle)
        sub = node.subscribe(args.topic, timeout=60)
        for latest in latest_readings(sub, timeout=args.silence, stop=stop):
            print(format_table(latest, time.time()), end="\n\n", flush=True)
    return _exit_code(signals)


def cmd_demo(args: argparse.Namespace) -> int:
    """Three sensors and a dashboard in this process, on 127.0.0.1 (seeded by the first)."""
    with tempfile.TemporaryDirectory(prefix="p2p-sensors-") as tmp:
        root = Path(tmp)
        init_fleet(root / "fleet", psk=True)
        names = ["dashboard", "greenhouse", "garage", "attic"]
        for name in names:
            add_node(root / "fleet", root / name)
        stop = threading.Event()
        signals = _on_signals(stop)
        with BlockingNode(root / "dashboard", NodeConfig(discovery=False)) as dash:
            seeds = (f"127.0.0.1:{dash.port}",)
            nodes = [
                BlockingNode(root / n, NodeConfig(discovery=False, seeds=seeds)) for n in names[1:]
            ]
            try:
                dash.wait_for_members(len(names), timeout=30)
                sub = dash.subscribe("sensors", timeout=30)
                threads = [
                    threading.Thread(
                        target=run_sensor, daemon=True, args=(n, "sensors", name, 1.0, stop)
                    )
                    for n, name in zip(nodes, names[1:], strict=True)
                ]
                for t in threads:
                    t.start()
                latest: dict[str, Reading] = {}
                deadline = time.monotonic() + args.duration
                for snapshot in latest_readings(sub, timeout=5, stop=stop):
                    latest = snapshot
                    if time.monotonic() > deadline:
                        break
                print(format_table(latest, time.time()))
                stop.set()
                for t in threads:
                    t.join()
            finally:
                for n in nodes:
                    n.close()
        print(f"{len(latest)} devices reporting ('*': simulated temperature)")
    if signals:
        return _exit_code(signals)
    return 0 if len(latest) == len(names) - 1 else 1


def _on_signals(stop: threading.Event) -> list[int]:
    """SIGTERM (systemd stop) and SIGINT end the loop cleanly: ``stop`` is set and the
    node closes as usual (a graceful leave).  Returns the signals received; a second
    one ends the process at once."""
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) > 1:
            print("sensor: stopped by a second signal", file=sys.stderr, flush=True)
            os._exit(_exit_code(received))
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
    return received


def _exit_code(signals: list[int]) -> int:
    """130 if the first signal was SIGINT (as a shell reports Ctrl-C), else 0."""
    return INTERRUPTED if signals[:1] == [signal.SIGINT] else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m edge_examples.sensor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "dashboard"):
        p = sub.add_parser(name)
        add_node_options(p)  # p2p node's: --identity, --interface, --seed, --telemetry, ...
        p.add_argument("--topic", default="sensors")
    run = sub.choices["run"]
    run.add_argument("--device", help="device name in readings (default: the node directory)")
    run.add_argument("--interval", type=finite, default=10.0, help="seconds between readings")
    run.add_argument("--count", type=int, help="stop after this many readings")
    dash = sub.choices["dashboard"]
    dash.add_argument(
        "--silence",
        type=finite,
        default=3600.0,
        help="exit after this many seconds without a reading",
    )
    demo = sub.add_parser("demo", help="three sensors and a dashboard on 127.0.0.1")
    demo.add_argument("--duration", type=finite, default=10.0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.ERROR if getattr(args, "quiet", False) else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    return run_cli(partial(_run, args), debug=getattr(args, "debug", False), prog="sensor")


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "interval", 1.0) <= 0 or getattr(args, "duration", 1.0) <= 0:
        raise P2PError("--interval and --duration must be positive")
    if args.command == "demo":
        logging.getLogger("p2p").setLevel(logging.WARNING)  # the node's join lines
    commands = {"run": cmd_run, "dashboard": cmd_dashboard, "demo": cmd_demo}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())

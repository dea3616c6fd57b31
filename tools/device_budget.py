"""What a node costs a small device: ``make device-budget`` (both builds) or
``python -m tools.device_budget`` (the build installed now).

Runs real ``p2p node`` processes on 127.0.0.1 and reads the counters they
print themselves (``p2p node --stats-every``):

1. **idle**: two nodes of a fleet find each other by mDNS and do nothing;
   the RSS, OS threads and open sockets of one of them after ``--idle`` s.
2. **at R msg/s** for each ``--rates`` R: one node publishes R messages a
   second for ``--seconds`` s (seeds, no mDNS), another subscribes; over the
   steady part of the run (10 % .. 95 % of the messages), each node's CPU
   time per message (publisher: per publication, subscriber: per delivery),
   its share of one core, and its largest RSS.

Prints a Markdown table and writes JSON (``--out``).  The numbers are this
host's: a Raspberry Pi class core is some 3-6 times slower per message.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

P2P = [sys.executable, "-m", "p2p"]

LINE = re.compile(
    r"stats: rss (?P<rss>[\d.-]+) MB, threads (?P<threads>-?\d+), sockets (?P<sockets>-?\d+), "
    r"cpu (?P<cpu>[\d.]+) s \([\d.]+ % of a core\), published (?P<published>\d+) \(\d+/s\), "
    r"delivered (?P<delivered>\d+) \(\d+/s\)"
)


@dataclass(frozen=True, slots=True)
class Sample:
    """One ``stats:`` line of ``p2p node --stats-every``."""

    rss_mb: float
    threads: int
    sockets: int
    cpu_s: float
    published: int
    delivered: int


def parse(text: str) -> list[Sample]:
    """The ``stats:`` lines of a node's stderr, in order."""
    fields = ("rss", "threads", "sockets", "cpu", "published", "delivered")
    kinds = (float, int, int, float, int, int)
    return [
        Sample(*(kind(m[name]) for kind, name in zip(kinds, fields, strict=True)))
        for m in LINE.finditer(text)
    ]


@dataclass(frozen=True, slots=True)
class Load:
    """One node's cost over the steady part of a run."""

    messages: int
    """Publications (publisher) or deliveries (subscriber) in the window."""
    cpu_us_per_msg: float
    cpu_pct: float
    """Share of one core over the window."""
    max_rss_mb: float
    threads: int
    sockets: int


def steady(samples: list[Sample], key: str, total: int, every: float) -> Load:
    """Cost per message between the first sample at 10 % of ``total`` messages
    (``key``: published or delivered) and the last at or below 95 %."""
    counts = [getattr(s, key) for s in samples]
    first = next((i for i, n in enumerate(counts) if n >= total * 0.10), None)
    last = max((i for i, n in enumerate(counts) if n <= total * 0.95), default=None)
    if first is None or last is None or last <= first:
        raise SystemExit(f"device_budget: too few samples for a steady window: {counts}")
    a, b = samples[first], samples[last]
    messages = counts[last] - counts[first]
    cpu = b.cpu_s - a.cpu_s
    return Load(
        messages=messages,
        cpu_us_per_msg=round(1e6 * cpu / max(messages, 1), 1),
        cpu_pct=round(100 * cpu / ((last - first) * every), 1),
        max_rss_mb=max(s.rss_mb for s in samples),
        threads=b.threads,
        sockets=b.sockets,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _run(root: Path, runs: list[tuple[str, list[str]]], timeout: float) -> dict[str, str]:
    """Start ``p2p node`` once per ``(name, args)`` at once; their stderr once all have ended."""
    procs = []
    try:
        for name, args in runs:
            log = open(root / f"{name}.log", "w", encoding="utf-8")  # noqa: SIM115
            procs.append((name, log, subprocess.Popen(
                [*P2P, "node", "--identity", str(root / name), *args],
                stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
            )))  # fmt: skip
        for name, _, proc in procs:
            if proc.wait(timeout) != 0:
                text = (root / f"{name}.log").read_text()[-2000:]
                raise SystemExit(f"device_budget: node {name} failed ({proc.returncode}):\n{text}")
    finally:
        for _, log, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    return {name: (root / f"{name}.log").read_text() for name, _ in runs}


def idle(root: Path, seconds: float, every: float) -> dict[str, Any]:
    """Two nodes that found each other by mDNS and do nothing: one node's footprint."""
    args = ["--stats-every", str(every), "--duration", str(seconds), "--quiet"]
    logs = _run(root, [("a", args), ("b", args)], seconds + 30)
    samples = parse(logs["a"])
    if not samples:
        raise SystemExit("device_budget: the idle node printed no stats")
    last = samples[-1]
    return {"rss_mb": last.rss_mb, "threads": last.threads, "sockets": last.sockets,
            "cpu_pct": round(100 * (last.cpu_s - samples[0].cpu_s)
                             / max((len(samples) - 1) * every, every), 2)}  # fmt: skip


def loaded(root: Path, rate: int, seconds: float, every: float) -> dict[str, Any]:
    """A publisher at ``rate`` msg/s and one subscriber, ``seconds`` long."""
    pa, pb = _free_port(), _free_port()
    count = int(rate * seconds)
    settle = 2.0
    duration = settle + seconds + 3
    stats = ["--stats-every", str(every), "--quiet", "--no-mdns"]
    publisher = [*stats, "--port", str(pa), "--seed", f"127.0.0.1:{pb}", "--publish", "chat",
                 "--rate", str(rate), "--count", str(count), "--settle", str(settle),
                 "--duration", str(duration)]  # fmt: skip
    subscriber = [*stats, "--port", str(pb), "--seed", f"127.0.0.1:{pa}", "--subscribe", "chat",
                  "--settle", "0.5", "--duration", str(duration + 1)]  # fmt: skip
    logs = _run(root, [("a", publisher), ("b", subscriber)], duration + 30)
    pub, sub = parse(logs["a"]), parse(logs["b"])
    delivered = sub[-1].delivered if sub else 0
    if delivered < count:
        raise SystemExit(f"device_budget: {delivered} of {count} messages delivered at {rate}/s")
    return {
        "rate": rate,
        "messages": count,
        "publisher": asdict(steady(pub, "published", count, every)),
        "subscriber": asdict(steady(sub, "delivered", count, every)),
    }


def build_kind() -> str:
    out = subprocess.run([*P2P, "--version"], capture_output=True, text=True, check=True)
    return "mypyc" if "mypyc" in out.stdout else "pure"


def table(result: dict[str, Any]) -> str:
    i = result["idle"]
    rows = [
        f"| build: {result['build']} | value |",
        "|---|---:|",
        f"| idle node (mDNS, one peer): RSS, MB | {i['rss_mb']:.1f} |",
        f"| idle node: OS threads | {i['threads']} |",
        f"| idle node: open sockets | {i['sockets']} |",
        f"| idle node: CPU, % of a core | {i['cpu_pct']:.2f} |",
    ]
    for r in result["rates"]:
        for role in ("publisher", "subscriber"):
            x = r[role]
            rows.append(
                f"| {r['rate']:,} msg/s, {role}: CPU per message, µs / % of a core / "
                f"max RSS, MB | {x['cpu_us_per_msg']:.1f} / {x['cpu_pct']:.1f} / "
                f"{x['max_rss_mb']:.1f} |"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.device_budget", description=__doc__)
    parser.add_argument("--rates", default="100,1000", help="msg/s to measure (default 100,1000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="publishing time per rate")
    parser.add_argument("--idle", type=float, default=8.0, help="seconds of the idle run")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",") if r]
    if not rates or min(rates) <= 0 or args.seconds < 3 * args.every:
        parser.error("give positive --rates and --seconds of at least 3 samples")
    with tempfile.TemporaryDirectory(prefix="p2p-budget-") as tmp:
        root = Path(tmp)
        subprocess.run([*P2P, "fleet", "init", str(root / "fleet"), "--psk"], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        for name in ("a", "b"):
            subprocess.run([*P2P, "fleet", "add-node", str(root / "fleet"), str(root / name)],
                           check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        started = time.monotonic()
        result: dict[str, Any] = {
            "build": build_kind(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "idle": idle(root, args.idle, args.every),
            "rates": [loaded(root, rate, args.seconds, args.every) for rate in rates],
        }
        result["wall_s"] = round(time.monotonic() - started, 1)
    print(table(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

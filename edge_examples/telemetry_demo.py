"""The whole telemetry pipeline on this host, in one command.

::

    python -m edge_examples.telemetry_demo [--nodes 4] [--duration 10] [--out DIR]

1. A throw-away fleet: a collector (``p2p telemetry collect``, a process of
   its own as on a real site) and ``--nodes`` real nodes on 127.0.0.1
   (TCP, encryption, static seeds).  Each records telemetry every second into
   its own spool and uploads it to the collector every 2 s.
2. The nodes chat on a few rooms with skewed popularity for ``--duration``
   seconds, then close (last window, ``stop`` event, final upload).
3. The Spark job (``p2p telemetry aggregate``, local mode) reads the
   collector's landing directory and writes the tables and ``report.html``.

It prints where the report is.  Step 3 needs the ``spark`` extra
(``pip install -e '.[spark]'``) and Java 17+; without them the demo stops
after step 2 with a clear message and exit status 2.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import subprocess
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import trio

from p2p import Node, NodeConfig, P2PError, open_node
from p2p.cli import finite
from p2p.cli import main as p2p_main
from p2p.fleet import add_node, init_fleet
from p2p.telemetry import iter_items

ROOMS = ("lobby", "lobby", "lobby", "games", "games", "help")
"""Rooms by popularity: the first is the hot topic."""


async def _chat(node: Node, rooms: list[str], rng: random.Random, stop: trio.Event) -> None:
    """Publish on a random room (weighted) ~10 times a second until ``stop``."""
    i = 0
    while not stop.is_set():
        room = rng.choice(ROOMS)
        if room in rooms:
            await node.publish(room, f"{node.id:016x} says {i}".encode())
            i += 1
        await trio.sleep(rng.uniform(0.05, 0.15))


async def _drain(sub: object) -> None:
    async for _ in sub:  # type: ignore[attr-defined]
        pass


@dataclass(frozen=True, slots=True)
class Landed:
    """What the collector landed: spool files, the records in them, the devices."""

    files: int
    records: int
    devices: int


async def run_fleet(root: Path, nodes: int, duration: float) -> Landed:
    """Steps 1 and 2: returns what landed in ``root / "landing"``."""
    init_fleet(root / "fleet", psk=True)
    for name in ["collector"] + [f"node{i}" for i in range(nodes)]:
        add_node(root / "fleet", root / name)
    command = [sys.executable, "-m", "p2p", "telemetry", "collect", str(root / "landing"),
               "--identity", str(root / "collector"), "--port", "0"]  # fmt: skip
    async with trio.open_nursery() as nursery:
        proc: trio.Process = await nursery.start(
            lambda task_status: trio.run_process(
                command, stderr=subprocess.PIPE, check=False, task_status=task_status
            )
        )
        try:
            address = await _collector_address(proc)
            nursery.start_soon(_discard, proc.stderr)  # its log must not fill the pipe
            await _chat_fleet(root, nodes, duration, address)
        finally:
            proc.send_signal(signal.SIGTERM)  # a graceful stop: exit status 0
    if proc.returncode != 0:
        raise P2PError(f"the collector ended with status {proc.returncode}")
    return _landed(root / "landing")


async def _collector_address(proc: trio.Process) -> str:
    """``HOST:PORT`` from the collector's ``collecting on HOST:PORT into ...`` line."""
    assert proc.stderr is not None
    seen = b""
    with trio.fail_after(30):
        async for chunk in proc.stderr:
            seen += chunk
            found = re.search(rb"collecting on (\S+:\d+) into", seen)
            if found:
                return found.group(1).decode()
    raise P2PError(f"the collector did not start: {seen.decode(errors='replace')[-300:]}")


async def _discard(stream: trio.abc.ReceiveStream | None) -> None:
    if stream is not None:
        async for _ in stream:
            pass


def _landed(landing: Path) -> Landed:
    files = sorted(landing.glob("date=*/device=*/*.cbor"))
    records = sum(1 for f in files for item, err in iter_items(f.read_bytes()) if err is None)
    return Landed(len(files), records, len({f.parent.name for f in files}))


async def _chat_fleet(root: Path, nodes: int, duration: float, collector: str) -> None:
    rng = random.Random(1)
    stop = trio.Event()
    async with AsyncExitStack() as stack:
        opened: list[Node] = []
        for i in range(nodes):
            seeds = (f"127.0.0.1:{opened[0].port}",) if opened else ()
            cfg = NodeConfig(discovery=False, seeds=seeds, telemetry_dir=root / f"spool{i}",
                             telemetry_window=1.0, telemetry_collector=collector,
                             telemetry_upload_interval=2.0)  # fmt: skip
            opened.append(await stack.enter_async_context(open_node(root / f"node{i}", cfg)))
        with trio.fail_after(30):
            while any(len(n.members()) < nodes for n in opened):
                await trio.sleep(0.05)
        print(f"{nodes} nodes up; chatting for {duration:.0f} s", file=sys.stderr)
        async with trio.open_nursery() as nursery:
            for node in opened:
                rooms = sorted({rng.choice(ROOMS) for _ in range(3)})
                for room in rooms:
                    nursery.start_soon(_drain, await node.subscribe(room))
                nursery.start_soon(_chat, node, rooms, random.Random(node.id), stop)
            await trio.sleep(duration)
            stop.set()
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edge_examples.telemetry_demo")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--duration", type=finite, default=10.0)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("telemetry-demo"),
        help="landing data and results (default: ./telemetry-demo, kept after the run)",
    )
    args = parser.parse_args(argv)
    if not 2 <= args.nodes <= 32 or args.duration <= 0:
        print("telemetry_demo: error: need 2..32 nodes and a positive duration", file=sys.stderr)
        return 2
    root = args.out
    if root.exists() and any(root.iterdir()):
        print(f"telemetry_demo: error: {root} is not empty (an earlier run?): remove it "
              "or pass another --out", file=sys.stderr)  # fmt: skip
        return 2
    root.mkdir(parents=True, exist_ok=True)
    try:
        s = trio.run(run_fleet, root, args.nodes, args.duration)
    except P2PError as exc:
        print(f"telemetry_demo: error: {exc}", file=sys.stderr)
        return 1
    print(f"collector: {s.files} files, {s.records} records landed "
          f"from {s.devices} devices in {root / 'landing'}")  # fmt: skip
    code = p2p_main(["telemetry", "aggregate", str(root / "landing"),
                     "--out", str(root / "results"), "--master", "local[2]",
                     "--window", "5"])  # fmt: skip
    if code == 0:
        print(f"report: {root / 'results' / 'report.html'}")
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The whole telemetry pipeline on this host, in one command.

::

    python -m edge_examples.telemetry_demo [--nodes 4] [--duration 10] [--out DIR]

1. A throw-away fleet: a collector and ``--nodes`` real nodes on 127.0.0.1
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
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from p2p import Node, NodeConfig, open_node
from p2p._errors import P2PError
from p2p._identity import add_node, init_fleet, load_node
from p2p.cli import finite
from p2p.telemetry._collector import Collector, run_collector

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


async def run_fleet(root: Path, nodes: int, duration: float) -> Collector:
    """Steps 1 and 2: returns the collector (its landing directory is under ``root``)."""
    init_fleet(root / "fleet", psk=True)
    for name in ["collector"] + [f"node{i}" for i in range(nodes)]:
        add_node(root / "fleet", root / name)
    ident, fleet = load_node(root / "collector")
    async with trio.open_nursery() as outer:
        collector: Collector = await outer.start(run_collector, ident, fleet, root / "landing")
        await _chat_fleet(root, nodes, duration, f"127.0.0.1:{collector.port}")
        outer.cancel_scope.cancel()
    return collector


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
    collector = trio.run(run_fleet, root, args.nodes, args.duration)
    s = collector.stats
    print(f"collector: {s.files_landed} files, {s.records_landed} records landed "
          f"from {len(s.per_device)} devices in {root / 'landing'}")  # fmt: skip
    from p2p.telemetry._cli import main as telemetry

    try:
        code = telemetry(["telemetry", "aggregate", str(root / "landing"),
                          "--out", str(root / "results"), "--master", "local[2]",
                          "--window", "5"])  # fmt: skip
    except P2PError as exc:
        print(f"telemetry_demo: error: {exc}", file=sys.stderr)
        return 2
    if code == 0:
        print(f"report: {root / 'results' / 'report.html'}")
    return code


if __name__ == "__main__":
    sys.exit(main())

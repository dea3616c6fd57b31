"""``p2p node``: run one real node from the command line (a contract: scripts call it).

::

    p2p node --identity NODE_DIR --interface 127.0.0.1 [--port 0]
             [--subscribe TOPIC]... [--publish TOPIC --count C --rate R]
             [--duration SECONDS] [--trace TRACE.jsonl]

The trace has the format of ``p2p sim`` (one JSON object per line: ``time``,
``node``, ``event``, ``topic``, ``source``, ``seq``) with wall-clock times and
``node``/``source`` as 16-digit hex ids.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import IO

import trio

from p2p._errors import P2PError
from p2p._node import Delivery, Node, NodeConfig, Subscription, open_node


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    node = sub.add_parser("node", help="run one node on the network (mDNS discovery)")
    node.add_argument(
        "--identity", type=Path, required=True, help="node directory (fleet add-node)"
    )
    node.add_argument("--interface", default="127.0.0.1", help="address to listen and announce on")
    node.add_argument("--port", type=int, default=0, help="TCP port (0: any free port)")
    node.add_argument("--subscribe", action="append", default=[], metavar="TOPIC")
    node.add_argument("--publish", metavar="TOPIC", help="publish on TOPIC (subscribes to it)")
    node.add_argument("--count", type=int, default=10, help="publications to make (default 10)")
    node.add_argument("--rate", type=float, default=1.0, help="publications per second")
    node.add_argument("--payload-size", type=int, default=0, help="pad payloads to this size")
    node.add_argument("--duration", type=float, help="seconds to run (default: until Ctrl-C)")
    node.add_argument(
        "--settle", type=float, default=2.0, help="seconds to discover peers before subscribing"
    )
    node.add_argument("--trace", type=Path, help="write TRACE.jsonl here")
    node.add_argument("--quiet", action="store_true", help="only errors on stderr")


class _Trace:
    """Writes trace lines as events happen (flushed, so a killed node keeps its trace)."""

    def __init__(self, fh: IO[str] | None, node: list[int]) -> None:
        self.fh = fh
        self.node = node

    def __call__(self, event: str, topic: str, source: int | None, seq: int | None) -> None:
        if self.fh is None:
            return
        line = {
            "time": time.time(),
            "node": f"{self.node[0]:016x}",
            "event": event,
            "topic": topic,
            "source": f"{source:016x}" if source is not None else f"{self.node[0]:016x}",
            "seq": seq,
        }
        self.fh.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.fh.flush()


def _check(args: argparse.Namespace) -> None:
    if not 0 <= args.port < 65536:
        raise P2PError(f"--port must be in 0..65535, got {args.port}")
    if args.rate <= 0 or args.count < 0:
        raise P2PError("--rate must be positive and --count non-negative")
    if args.duration is not None and args.duration <= 0:
        raise P2PError("--duration must be positive")
    if not 0 <= args.payload_size <= 1 << 16:
        raise P2PError("--payload-size must be in 0..65536")


def cmd_node(args: argparse.Namespace) -> int:
    _check(args)
    logging.basicConfig(
        level=logging.ERROR if args.quiet else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    fh = open(args.trace, "w", encoding="utf-8") if args.trace else None  # noqa: SIM115
    try:
        trio.run(_run, args, fh)
    finally:
        if fh is not None:
            fh.close()
    return 0


async def _run(args: argparse.Namespace, fh: IO[str] | None) -> None:
    me: list[int] = [0]
    cfg = NodeConfig(interface=args.interface, port=args.port)
    trace = _Trace(fh, me)
    topics = list(dict.fromkeys([*args.subscribe, *([args.publish] if args.publish else [])]))
    counts = {"delivered": 0}
    with trio.move_on_after(args.duration if args.duration else float("inf")):
        async with open_node(args.identity, cfg, trace=trace) as node:
            me[0] = node.id
            _say(args, f"node {node.id:016x} listening on {args.interface}:{node.port}")
            await trio.sleep(args.settle)
            _say(args, f"{len(node.members()) - 1} peers found")
            async with trio.open_nursery() as nursery:
                for topic in topics:
                    sub = await node.subscribe(topic)
                    _say(args, f"subscribed to {topic!r} ({len(node.core.view(topic))} members)")
                    nursery.start_soon(_drain, sub, counts)
                if args.publish:
                    await _publish(node, args)
                    _say(args, f"published {args.count} on {args.publish!r}")
                await trio.sleep_forever()
    _say(args, f"stopped: {counts['delivered']} deliveries")


async def _drain(sub: Subscription, counts: dict[str, int]) -> None:
    async for _ in sub:
        counts["delivered"] += 1


async def _publish(node: Node, args: argparse.Namespace) -> None:
    for i in range(args.count):
        body = f"{node.id:016x}:{i}".encode()
        await node.publish(args.publish, body.ljust(args.payload_size, b"."))
        await trio.sleep(1.0 / args.rate)


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(f"p2p node: {text}", file=sys.stderr, flush=True)


__all__ = ["Delivery", "add_parser", "cmd_node"]

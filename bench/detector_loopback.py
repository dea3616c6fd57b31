"""The runtime's failure detector on loopback: 16 real nodes, kills one at a time.

``python -m bench.detector_loopback [--duration 60] [--nodes 16] [--out FILE]``

One process runs every node (``p2p.open_node``: TCP on 127.0.0.1, the fleet's
secure channel, static seeds, no mDNS), each in a cancel scope of its own.
Why one process and not 16: a kill is the cancellation of a node's scope,
which closes its sockets at once without the graceful leave, as the kernel
does for a SIGKILLed process, so the survivors see what they would see; all
times come from one clock; and 16 interpreters would compete for the 2 cores
of the benchmark host far more than 16 nodes in one event loop.  The price:
one node's work delays the others' detector rounds, so a loaded loop makes
this measurement pessimistic, not optimistic.

Method: detector rounds of ``--interval`` (1 s), ``attempts = 2``, probe
``--timeout`` (default: the interval, the runtime's default); probes expire
at their deadline, suspicions are pushed down the broadcast trees, and a
connection that breaks and cannot be re-dialled makes its node probe the
peer at once.  Every node subscribes to ``load``, and the first
``--publishers`` nodes (default 2: nodes 0 and 1; never killed) publish there
``--rate`` messages per second each.  After
``--warmup`` seconds, a node (never 0 or 1) is killed every
``--kill-every`` seconds while at least ``--keep`` nodes remain.  Reported:

* time to detect: from a kill to the last survivor's ``Suspected`` (the
  membership event ``left``/``suspected`` for that node), median and max;
* false suspicions: suspicions of nodes that were not killed, and
  self-suspicions (reincarnations);
* detector bytes per second per node: control packets sent (probes,
  replies, pushes; a frame of only control packets counts whole, prefix and
  seal included) and the detector version piggybacked on every data frame,
  over the whole run and the live nodes; detector messages (probes, replies,
  pushes) per second per node; pushes sent per kill and survivor;
* deliveries: publications of the publishers missing at a survivor at the end.

Writes ``bench/results/detector_loopback.json``; every node is cancelled on
exit, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio

from p2p.fleet import Fleet, NodeIdentity, add_node, init_fleet, load_node
from p2p.runtime import Delivery, Node, NodeConfig, open_node

_IGNORED = trio.TASK_STATUS_IGNORED
Ident = tuple[NodeIdentity, Fleet]
RESULTS = Path(__file__).parent / "results" / "detector_loopback.json"


class Bench:
    """The nodes, their scopes and what their watchers saw."""

    def __init__(self, args: argparse.Namespace, idents: list[tuple[NodeIdentity, Fleet]]) -> None:
        self.args = args
        self.idents = idents
        self.nodes: dict[int, Node] = {}
        self.scopes: dict[int, trio.CancelScope] = {}
        self.killed_at: dict[int, float] = {}  # node id -> kill time
        self.suspected: dict[int, dict[int, float]] = {}  # victim -> observer -> time
        self.false: list[tuple[int, int]] = []
        self.got: dict[int, list[Delivery]] = {}

    def config(self, seed: int | None) -> NodeConfig:
        return NodeConfig(
            discovery=False,
            seeds=() if seed is None else (f"127.0.0.1:{seed}",),
            seed_interval=5.0,
            detector_interval=self.args.interval,
            detector_timeout=self.args.timeout,
            drain_timeout=0.5,
        )

    async def run_node(
        self,
        i: int,
        cfg: NodeConfig,
        *,
        task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with trio.CancelScope() as scope:
            self.scopes[i] = scope
            async with open_node(self.idents[i], cfg) as node, trio.open_nursery() as inner:
                self.nodes[i] = node
                inner.start_soon(self.watch, node)
                task_status.started(node)
                await trio.sleep_forever()

    async def watch(self, node: Node) -> None:
        """Record every suspicion ``node`` raises, and whether its target was killed."""
        async with node.membership() as events:
            async for e in events:
                if e.kind == "left" and e.reason == "suspected":
                    if e.node in self.killed_at:
                        self.suspected.setdefault(e.node, {})[node.id] = trio.current_time()
                    else:
                        self.false.append((node.id, e.node))

    async def publish(self, node: Node) -> None:
        k = 0
        while True:
            await node.publish("load", b"%d" % k)
            k += 1
            await trio.sleep(1 / self.args.rate)

    def kill(self, i: int) -> None:
        node = self.nodes.pop(i)
        self.killed_at[node.id] = trio.current_time()
        self.scopes[i].cancel()


async def _run(
    args: argparse.Namespace, idents: list[tuple[NodeIdentity, Fleet]]
) -> dict[str, Any]:
    b = Bench(args, idents)
    n = args.nodes
    async with trio.open_nursery() as nursery:
        first = await nursery.start(partial(b.run_node, 0, b.config(None)))
        for i in range(1, n):
            await nursery.start(partial(b.run_node, i, b.config(first.port)))
        with trio.fail_after(60):
            while any(len(x.members()) < n for x in b.nodes.values()):
                await trio.sleep(0.1)
            async with trio.open_nursery() as subs:
                for i, node in b.nodes.items():
                    subs.start_soon(_subscribe_then_collect, b, nursery, i, node)
        for i in range(args.publishers) if args.rate > 0 else ():
            nursery.start_soon(b.publish, b.nodes[i])
        bytes0 = {i: x.stats["detector_bytes_sent"] for i, x in b.nodes.items()}
        pushes0 = {i: _pushes(x) for i, x in b.nodes.items()}
        messages0 = {i: _messages(x) for i, x in b.nodes.items()}
        start = trio.current_time()
        await trio.sleep(args.warmup)
        victims = list(range(n - 1, args.publishers - 1, -1))[: max(0, n - args.keep)]
        for v in victims:
            if trio.current_time() - start > args.duration - args.kill_every:
                break
            b.kill(v)
            await trio.sleep(args.kill_every)
        await trio.sleep(max(0.0, args.duration - (trio.current_time() - start)))
        elapsed = trio.current_time() - start
        survivors = dict(b.nodes)
        sent = sum(x.stats["detector_bytes_sent"] - bytes0[i] for i, x in survivors.items())
        pushes = sum(_pushes(x) - pushes0[i] for i, x in survivors.items())
        messages = sum(_messages(x) - messages0[i] for i, x in survivors.items())
        reincarnations = sum(x.stats["reincarnations"] for x in survivors.values())
        missing = _missing(b, survivors)
        nursery.cancel_scope.cancel()
    latencies, undetected = [], 0
    for victim, at in b.killed_at.items():
        seen = b.suspected.get(victim, {})
        observers = [x.id for x in survivors.values()]
        if all(o in seen for o in observers):
            latencies.append(max(seen[o] for o in observers) - at)
        else:
            undetected += 1
    return {
        "nodes": n,
        "interval_s": args.interval,
        "timeout_s": args.timeout if args.timeout is not None else args.interval,
        "attempts": 2,
        "duration_s": round(elapsed, 1),
        "publishers": args.publishers,
        "publish_rate_per_publisher": args.rate,
        "kills": len(b.killed_at),
        "undetected_kills": undetected,
        "detect_median_s": round(statistics.median(latencies), 3) if latencies else None,
        "detect_max_s": round(max(latencies), 3) if latencies else None,
        "detect_all_s": [round(x, 3) for x in latencies],
        "false_suspicions": len(b.false),
        "reincarnations": reincarnations,
        "detector_bytes_per_s_per_node": round(sent / elapsed / len(survivors), 1),
        "detector_messages_per_s_per_node": round(messages / elapsed / len(survivors), 2),
        "detector_pushes_per_kill_per_survivor": (
            round(pushes / len(b.killed_at) / len(survivors), 2) if b.killed_at else None
        ),
        "survivors": len(survivors),
        "missing_deliveries": missing,
    }


async def _subscribe_then_collect(b: Bench, nursery: trio.Nursery, i: int, node: Node) -> None:
    sub = await node.subscribe("load")
    out = b.got[i] = []

    async def drain() -> None:
        async for d in sub:
            out.append(d)

    nursery.start_soon(drain)


def _pushes(node: Node) -> int:
    """Detector pushes ``node`` sent so far (its own and forwarded)."""
    return node.detector.stats.pushes if node.detector is not None else 0


def _messages(node: Node) -> int:
    """Detector messages ``node`` sent so far: probes, replies and pushes."""
    det = node.detector
    return 0 if det is None else det.stats.probes + det.stats.replies + det.stats.pushes


def _missing(b: Bench, survivors: dict[int, Node]) -> int:
    """Publications of the publishers that some survivor has and another lacks
    (beyond the last two seconds, which may still be in flight)."""
    sources = {survivors[i].id for i in range(b.args.publishers)}
    sets = [{(d.source, d.seq) for d in b.got[i] if d.source in sources} for i in survivors]
    union = set().union(*sets)
    recent = {(s, q) for s, q in union if q >= max(x for y, x in union if y == s) - 2 * b.args.rate}
    return sum(len((union - recent) - s) for s in sets)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=60.0, help="seconds of measurement")
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--interval", type=float, default=1.0, help="detector round, seconds")
    p.add_argument(
        "--timeout", type=float, default=None, help="probe timeout, seconds (default: interval)"
    )
    p.add_argument(
        "--rate", type=float, default=10.0, help="publications/s of each publisher (0: idle)"
    )
    p.add_argument("--publishers", type=int, default=2, help="nodes 0.. that publish")
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--kill-every", type=float, default=10.0)
    p.add_argument("--keep", type=int, default=8, help="stop killing at this many nodes")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        init_fleet(Path(tmp) / "fleet", psk=True)
        idents = []
        for i in range(args.nodes):
            add_node(Path(tmp) / "fleet", Path(tmp) / f"n{i}", name=f"n{i}")
            idents.append(load_node(Path(tmp) / f"n{i}"))
        t0 = time.time()
        result = trio.run(_run, args, idents)
        result["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

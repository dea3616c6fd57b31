"""What the young-generation GC threshold does to a fan-out, in one process.

Run from the repository root (needs the ``bench`` extra for its payloads)::

    python -m bench.gc_young                 # 4 pairs of 200,000 publications
    python -m bench.gc_young --pairs 2 --messages 50000

Five real nodes (static seeds on 127.0.0.1, a throw-away PSK fleet) in one
trio loop: node 0 publishes flat out, keeping at most 4 rounds queued in its
core as the runtime benchmark's publisher does, and the 4 others subscribe
and read batches.  Each *pair* runs once with the interpreter's threshold
(700, ``NodeConfig(gc_young=None)``) and once with the node's default
(``NodeConfig.gc_young``), the order alternating; before each run the
threshold goes back to 700.  Per run: CPU seconds of the whole process per
publication (all five nodes), the young collections the collector ran
(``gc.callbacks``) and the time in them.  One process holds every node, so
the host's scheduling does not enter the CPU figure; the round sizes (and
so the per-round share) still vary from run to run.  Writes
``bench/results/gc_young.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._common import ROOT, machine
from bench._runtime_workers import PUBLISH_CHUNK, TOPIC, payload
from bench.runtime import free_ports

NODES = 5
PYTHON_YOUNG = 700
"""CPython's default young-generation threshold."""


class _Collections:
    """Young collections and their time, from ``gc.callbacks``, while installed."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 0:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._start


async def _fanout(root: Path, messages: int, young: int | None) -> dict[str, Any]:
    """One run: five nodes up, the fan-out, its figures."""
    import trio

    from p2p.fleet import add_node, init_fleet
    from p2p.runtime import NodeConfig, open_node

    init_fleet(root / "fleet", psk=True, name="gc")
    dirs = [root / f"n{i}" for i in range(NODES)]
    for i, d in enumerate(dirs):
        add_node(root / "fleet", d, name=f"gc{i}")
    ports = free_ports(NODES)
    nodes: list[Any] = [None] * NODES
    counts = [0] * NODES
    done = trio.Event()

    async def hold(i: int) -> None:
        seeds = tuple(f"127.0.0.1:{p}" for j, p in enumerate(ports) if j != i)
        cfg = NodeConfig(port=ports[i], discovery=False, seeds=seeds, gc_young=young)
        async with open_node(dirs[i], cfg) as node:
            nodes[i] = node
            await trio.sleep_forever()  # until the run is over (cancelled)

    async def receive(i: int, sub: Any) -> None:
        async for batch in sub.batches():
            counts[i] += len(batch)
            if min(counts[1:]) >= messages:
                done.set()

    async with trio.open_nursery() as nursery:
        for i in range(NODES):
            nursery.start_soon(hold, i)
        with trio.fail_after(30):
            while any(n is None or len(n.members()) < NODES for n in nodes):
                await trio.sleep(0.01)
        subs = [await n.subscribe(TOPIC, own=False) for n in nodes]
        for i in range(1, NODES):
            nursery.start_soon(receive, i, subs[i])
        await trio.sleep(0.5)
        pub = nodes[0]
        limit = 4 * pub.config.pubsub.max_round_messages
        young_gcs = _Collections()
        gc.callbacks.append(young_gcs)
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            seq = 0
            while seq < messages:
                n = min(limit - pub.core.queued(TOPIC), messages - seq)
                if n <= 0:
                    await trio.sleep(0.0005)
                    continue
                for first in range(seq, seq + n, PUBLISH_CHUNK):
                    last = min(first + PUBLISH_CHUNK, seq + n)
                    await pub.publish_many(TOPIC, [payload(k, 0) for k in range(first, last)])
                seq += n
                await trio.sleep(0)
            with trio.fail_after(60):
                await done.wait()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        finally:
            gc.callbacks.remove(young_gcs)
        nursery.cancel_scope.cancel()  # the nodes and their readers
    return {
        "threshold": gc.get_threshold()[0],
        "cpu_us_per_msg": 1e6 * cpu / messages,
        "wall_s": wall,
        "young_collections": young_gcs.count,
        "young_gc_us_per_msg": 1e6 * young_gcs.seconds / messages,
        "delivered_min": min(counts[1:]),
    }


def run(messages: int, young: int | None) -> dict[str, Any]:
    """One run in a fresh directory, from the interpreter's threshold."""
    import trio

    gc.set_threshold(PYTHON_YOUNG, *gc.get_threshold()[1:])
    with tempfile.TemporaryDirectory(prefix="bench-gc-young-") as tmp:
        out: dict[str, Any] = trio.run(_fanout, Path(tmp), messages, young)
        return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the pairs, print them and the medians, write the JSON; the exit status."""
    from p2p.runtime import NodeConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gc_young.json")
    args = parser.parse_args(argv)
    if args.pairs < 1 or args.messages < 1:
        print("--pairs and --messages must be at least 1", file=sys.stderr)
        return 2
    default = NodeConfig().gc_young
    sides = {"python": None, "node": default}
    pairs = []
    for k in range(args.pairs):
        pair: dict[str, Any] = {}
        for side in sorted(sides, reverse=k % 2 == 1):
            pair[side] = r = run(args.messages, sides[side])
            print(
                f"pair {k + 1} {side:<6} threshold {r['threshold']:>6}: "
                f"{r['cpu_us_per_msg']:.2f} us CPU per publication, "
                f"{r['young_collections']} young collections "
                f"({r['young_gc_us_per_msg']:.2f} us per publication)",
                flush=True,
            )
        pairs.append(pair)
    summary = {
        side: {
            key: statistics.median(p[side][key] for p in pairs)
            for key in ("cpu_us_per_msg", "young_collections", "young_gc_us_per_msg")
        }
        for side in sides
    }
    ratio = statistics.median(
        p["node"]["cpu_us_per_msg"] / p["python"]["cpu_us_per_msg"] for p in pairs
    )
    print(
        f"median CPU per publication: {summary['python']['cpu_us_per_msg']:.2f} us at "
        f"{PYTHON_YOUNG}, {summary['node']['cpu_us_per_msg']:.2f} us at {default} "
        f"(median pair ratio {ratio:.3f})"
    )
    doc = {
        "benchmark": "gc_young",
        "command": "python -m bench.gc_young " + " ".join(argv or sys.argv[1:]),
        "machine": machine(),
        "messages": args.messages,
        "pairs": pairs,
        "median": summary,
        "median_pair_ratio_cpu": ratio,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

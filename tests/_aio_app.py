"""A plain asyncio program on ``p2p.aio``, run as a real process by tests/test_aio.py.

``python tests/_aio_app.py NODE_DIR [--seed H:P] [--publish N] [--expect N]``

Prints JSON lines on stdout: ``{"port"}`` once the node listens, ``{"got"}``
when it has ``--expect`` deliveries from other nodes, ``{"member"}`` for each
membership event, and last ``{"end"}`` with the threads still running and the
socket descriptors still open after ``asyncio.run`` has returned.  Ctrl-C
ends it with status 130, SIGTERM with 0.  ``--orphan``: the node lives in a
task that ``main`` never awaits, so only the loop's shutdown (``asyncio.run``
cancelling what is left) can close it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections import Counter

from p2p import NodeConfig, P2PError, aio


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def sockets_open() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass
    return count


async def run_node(args: argparse.Namespace, done: asyncio.Event) -> None:
    cfg = NodeConfig(discovery=False, seeds=tuple(args.seed), detector_interval=0.5)
    async with aio.open_node(args.node_dir, cfg, queue_size=64) as node:
        say(port=node.port, id=f"{node.id:016x}")
        await node.wait_for_members(args.members)
        sub = await node.subscribe("chat")
        await asyncio.sleep(args.settle)
        await node.publish_many("chat", [f"{node.id:016x}:{i}" for i in range(args.publish)])
        sources: Counter[str] = Counter()
        async with node.membership() as events:
            watcher = asyncio.create_task(_watch(events))
            async for d in sub:
                if not d.own:
                    sources[f"{d.source:016x}"] += 1
                if sum(sources.values()) >= args.expect:
                    break
            say(got=dict(sources))
            done.set()
            try:
                await asyncio.Event().wait()  # until Ctrl-C, SIGTERM or the loop's shutdown
            finally:
                watcher.cancel()


async def _watch(events: aio.MembershipEvents) -> None:
    async for ev in events:
        say(member=ev.kind, node=f"{ev.node:016x}", reason=ev.reason)


async def main(args: argparse.Namespace) -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    done = asyncio.Event()
    if args.orphan:
        orphan = asyncio.create_task(run_node(args, done))
        await done.wait()
        say(returning=True)
        del orphan  # main returns; asyncio.run cancels the orphan at the loop's shutdown
        return
    await run_node(args, done)


def end_report(status: int) -> int:
    deadline = time.monotonic() + 15  # trio's idle worker threads exit 10 s after use
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    say(end=True, threads=[t.name for t in threading.enumerate()], sockets=sockets_open())
    return status


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("node_dir")
    parser.add_argument("--seed", action="append", default=[])
    parser.add_argument("--members", type=int, default=1)
    parser.add_argument("--settle", type=float, default=0.5)
    parser.add_argument("--publish", type=int, default=10)
    parser.add_argument("--expect", type=int, default=10)
    parser.add_argument("--orphan", action="store_true")
    options = parser.parse_args()
    try:
        asyncio.run(main(options))
    except KeyboardInterrupt:
        sys.exit(end_report(130))
    except asyncio.CancelledError:  # SIGTERM: main was cancelled, the node closed
        sys.exit(end_report(0))
    except P2PError as exc:
        print(f"aio_app: error: {exc}", file=sys.stderr)
        sys.exit(end_report(2))
    sys.exit(end_report(0))

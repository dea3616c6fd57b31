"""LAN chat on the library: rooms are topics, a reply never shows before what it answers.

Interactive, one per machine (each with its own node directory from
``p2p fleet add-node``)::

    python -m edge_examples.chat --identity NODE_DIR --interface 192.168.1.20 --room lobby

Type a line to send it; ``/reply TEXT`` answers the last message you saw.
Ctrl-C (or SIGTERM, or end of input) leaves the room and the overlay gracefully.

Local demo fleet (the README's main job): several nodes on this host, real
TCP and real mDNS on 127.0.0.1, bots that chat and answer each other, then a
summary of deliveries, ordering and latency::

    python -m edge_examples.chat --demo [--nodes 5] [--messages 6] [--rng-seed 1]

Causal order is what makes replies safe: a bot answers a message only after
delivering it, so the answer is causally after it, and every node delivers
it after the original, whatever the network does.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from p2p import P2PError
from p2p.cli import check_listen, graceful, run_cli
from p2p.fleet import add_node, init_fleet
from p2p.runtime import Delivery, Node, NodeConfig, Subscription, open_node
from p2p.sim import TraceEvent, check_trace, format_violations


@dataclass(frozen=True, slots=True)
class ChatLine:
    """What travels in a payload (JSON): author, text, the message it answers, send time."""

    author: str
    text: str
    reply_to: tuple[str, int] | None
    sent: float

    def encode(self) -> bytes:
        return json.dumps(
            {"a": self.author, "t": self.text, "r": self.reply_to, "s": self.sent}
        ).encode()

    @staticmethod
    def decode(data: bytes) -> ChatLine | None:
        """``None`` for a payload that is not a chat line (other apps may share a room)."""
        try:
            doc = json.loads(data)
            reply = doc["r"]
            ref = (str(reply[0]), int(reply[1])) if reply else None
            return ChatLine(str(doc["a"]), str(doc["t"]), ref, float(doc["s"]))
        except (ValueError, KeyError, TypeError, IndexError):
            return None


def _key(d: Delivery) -> tuple[str, int]:
    return (f"{d.source:016x}", d.seq)


# ----------------------------------------------------------------- the demo


@dataclass
class _Bot:
    """One demo participant: delivers, records, sometimes answers."""

    node: Node
    name: str
    index: int
    seen: list[tuple[str, int]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    out_of_order_replies: int = 0


class _Tracer:
    """Collects every node's trace events with ids turned into stable indices."""

    def __init__(self) -> None:
        self.events: list[TraceEvent] = []
        self.index: dict[int, int] = {}

    def idx(self, node_id: int) -> int:
        return self.index.setdefault(node_id, len(self.index))

    def hook(self, me: list[int]) -> Callable[[str, str, int | None, int | None, int], None]:
        def record(event: str, topic: str, source: int | None, seq: int | None, inc: int) -> None:
            src = self.idx(source if source is not None else me[0])
            self.events.append(
                TraceEvent(trio.current_time(), self.idx(me[0]), event, topic, src, seq)
            )

        return record


async def _listen(bot: _Bot, sub: Subscription) -> None:
    async for d in sub:
        now = time.time()
        line = ChatLine.decode(d.payload)
        if line is not None and not d.own:
            bot.latencies.append(now - line.sent)
            if line.reply_to is not None and line.reply_to not in bot.seen:
                bot.out_of_order_replies += 1
        bot.seen.append(_key(d))


async def _talk(bot: _Bot, room: str, messages: int, rng: random.Random) -> None:
    for i in range(messages):
        await trio.sleep(rng.uniform(0.05, 0.3))
        reply = bot.seen[-1] if bot.seen and rng.random() < 0.7 else None
        text = f"{'re: ' if reply else ''}message {i} from {bot.name}"
        await bot.node.publish(room, ChatLine(bot.name, text, reply, time.time()).encode())


async def run_demo(nodes: int, messages: int, seed: int, room: str = "lobby") -> int:
    """Start ``nodes`` real nodes on loopback, chat, print a summary; 0 if all checks pass
    (Ctrl-C: 130, SIGTERM: 0, no summary)."""
    async with graceful() as stop:
        with stop.scope:
            return await _demo(nodes, messages, seed, room)
    return stop.exit_code


async def _demo(nodes: int, messages: int, seed: int, room: str) -> int:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="p2p-chat-demo-") as tmp:
        base = Path(tmp)
        init_fleet(base / "fleet", psk=True, name="demo")
        dirs = [base / f"node{i}" for i in range(nodes)]
        for i, d in enumerate(dirs):
            add_node(base / "fleet", d, name=f"bot{i}")
        # A service type of its own, so two demos on one host never mix.
        cfg = NodeConfig(service_type=f"_chat{rng.randrange(1 << 32):08x}._tcp.local.")
        print(f"Starting {nodes} nodes on 127.0.0.1 (real TCP, encrypted, mDNS discovery)...")
        started = time.monotonic()
        tracer = _Tracer()
        async with trio.open_nursery() as nursery:
            ready: list[Node] = []
            done = trio.Event()
            for d in dirs:
                nursery.start_soon(_hold_node, d, cfg, ready, done, tracer)
            with trio.fail_after(30):
                while len(ready) < nodes or any(len(n.members()) < nodes for n in ready):
                    await trio.sleep(0.05)
            print(f"  all {nodes} nodes found each other in {time.monotonic() - started:.1f} s")
            code = await _chat(ready, room, messages, rng, tracer)
            done.set()
        return code


async def _hold_node(
    directory: Path, cfg: NodeConfig, ready: list[Node], done: trio.Event, tracer: _Tracer
) -> None:
    me = [0]
    async with open_node(directory, cfg, trace=tracer.hook(me)) as node:
        me[0] = node.id
        tracer.idx(node.id)
        ready.append(node)
        await done.wait()


async def _chat(
    nodes: list[Node], room: str, messages: int, rng: random.Random, tracer: _Tracer
) -> int:
    bots = [_Bot(n, f"bot{i}", i) for i, n in enumerate(nodes)]
    subs = [await bot.node.subscribe(room) for bot in bots]
    print(f"  everyone joined room {room!r}; chatting ({messages} messages per bot)...")
    total = len(bots) * messages
    with trio.move_on_after(60) as scope:
        async with trio.open_nursery() as nursery:
            for bot, sub in zip(bots, subs, strict=True):
                nursery.start_soon(_listen, bot, sub)
            async with trio.open_nursery() as talkers:
                for bot in bots:
                    talkers.start_soon(_talk, bot, room, messages, random.Random(rng.random()))
            while any(len(b.seen) < total for b in bots):
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    return _summary(bots, tracer.events, total, timed_out=scope.cancelled_caught)


def _summary(bots: list[_Bot], trace: list[TraceEvent], total: int, *, timed_out: bool) -> int:
    lat = sorted(x for b in bots for x in b.latencies)
    ms = [1000 * x for x in lat]
    violations = [v for v in check_trace(trace) if v.kind != "missing"]
    bad_replies = sum(b.out_of_order_replies for b in bots)
    delivered = [len(b.seen) for b in bots]
    print(f"  deliveries per node: {delivered} (expected {total} each)")
    if ms:
        p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
        print(
            f"  delivery latency: p50 {statistics.median(ms):.1f} ms, p99 {p99:.1f} ms, "
            f"max {ms[-1]:.1f} ms over {len(ms)} deliveries"
        )
    print(f"  replies shown before what they answer: {bad_replies}")
    print(f"  causal order / FIFO / exactly-once: {format_violations(violations)}")
    ok = not timed_out and not violations and not bad_replies and min(delivered) == total
    print("Chat demo: OK" if ok else "Chat demo: FAILED (see above)")
    return 0 if ok else 1


# ------------------------------------------------------------ interactive


async def run_interactive(identity: Path, interface: str, room: str) -> int:
    """Chat until end of input, SIGINT (exit 130) or SIGTERM (0); the node leaves
    gracefully in every case (the signal cancels inside ``open_node``)."""
    cfg = NodeConfig(interface=interface)
    async with graceful() as stop, open_node(identity, cfg) as node:
        with stop.scope:
            await _chat_interactively(node, room)
    return stop.exit_code


async def _chat_interactively(node: Node, room: str) -> None:
    print(f"node {node.id:016x}: discovering peers for 2 s...", file=sys.stderr)
    await trio.sleep(2)
    sub = await node.subscribe(room)
    others = len(node.core.view(room)) - 1
    print(f"joined {room!r} with {others} others; type to chat, Ctrl-D (end of input) to leave")
    last: list[tuple[str, int]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_show, sub, last)
        await _read_stdin(node, room, last)
        nursery.cancel_scope.cancel()


async def _show(sub: Subscription, last: list[tuple[str, int]]) -> None:
    async for d in sub:
        if d.missed:  # the node was away (a split LAN, a restart): say so
            print(f"[{sub.topic}] ({d.missed} messages from {d.source:016x} missed)", flush=True)
        line = ChatLine.decode(d.payload)
        if line is None:
            continue
        last[:] = [_key(d)]
        prefix = "  (reply) " if line.reply_to else ""
        print(f"[{sub.topic}] {prefix}{line.author}: {line.text}", flush=True)


async def _read_stdin(node: Node, room: str, last: list[tuple[str, int]]) -> None:
    name = f"{node.id:016x}"[:6]
    while True:
        # abandoned on cancel: a blocked readline must not hold up Ctrl-C
        text = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if not text:
            return
        text = text.rstrip("\n")
        reply = None
        if text.startswith("/reply ") and last:
            reply, text = last[0], text[len("/reply ") :]
        if text:
            await node.publish(room, ChatLine(name, text, reply, time.time()).encode())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m edge_examples.chat", description=__doc__.splitlines()[0]
    )
    p.add_argument("--demo", action="store_true", help="run the local demo fleet and exit")
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--messages", type=int, default=6, help="messages per bot in the demo")
    p.add_argument("--rng-seed", type=int, default=1, help="random seed of the demo's bots")
    p.add_argument("--identity", type=Path, help="node directory (interactive mode)")
    p.add_argument("--interface", default="127.0.0.1")
    p.add_argument("--room", default="lobby")
    p.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    args = p.parse_args(argv)
    return run_cli(partial(_run, args), debug=args.debug, prog="chat")


def _run(args: argparse.Namespace) -> int:
    if args.demo:
        if not 2 <= args.nodes <= 32 or not 1 <= args.messages <= 1000:
            raise P2PError("--nodes must be 2..32 and --messages 1..1000")
        return trio.run(run_demo, args.nodes, args.messages, args.rng_seed)
    if args.identity is None:
        raise P2PError("give --identity NODE_DIR (or --demo)")
    check_listen(args.interface, 0)
    return trio.run(run_interactive, args.identity, args.interface, args.room)


if __name__ == "__main__":
    sys.exit(main())

"""``p2p node``, ``p2p sub``, ``p2p pub``, ``p2p status``: real nodes from the command line.

``p2p node`` is a contract (scripts call it)::

    p2p node --identity NODE_DIR --interface 127.0.0.1 [--port 0]
             [--subscribe TOPIC]... [--publish TOPIC --count C --rate R]
             [--duration SECONDS] [--trace TRACE.jsonl]

The trace has the format of ``p2p sim`` (one JSON object per line: ``time``,
``node``, ``event``, ``topic``, ``source``, ``seq``) with wall-clock times and
``node``/``source`` as 16-digit hex ids.

``p2p sub`` prints what a topic delivers, ``p2p pub`` publishes messages
(arguments or stdin lines), waits until every subscriber has each and says how
many other subscribers confirmed it, and ``p2p status`` lists the fleet's
members seen on an interface without joining.  All find peers by mDNS on
``--interface`` and, with ``--seed HOST:PORT``, by peer exchange with members
that listen there.

SIGINT and SIGTERM (and the end of ``--duration``) stop a command the same
way: the node leaves gracefully (its peers see a LEAVE, not a suspicion) and
the command exits 130 after SIGINT, 0 otherwise (:mod:`p2p._shutdown`).
"""

from __future__ import annotations

import argparse
import base64
import errno
import json
import logging
import os
import resource
import socket
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import IO, Any

import trio

from p2p._cliargs import finite, path_arg
from p2p._errors import CommandError, P2PError
from p2p._identity import Fleet, load_node
from p2p._membership import Peer
from p2p._shutdown import Shutdown, graceful
from p2p._transport import parse_address, verified_peer
from p2p.cli._budget import print_stats
from p2p.runtime import Delivery, Node, NodeConfig, Subscription, open_node
from p2p.runtime._discovery import SERVICE_TYPE, Discovery


def _common(p: argparse.ArgumentParser, *, settle: float = 2.0) -> None:
    p.add_argument(
        "--identity", type=path_arg, required=True, help="node directory (fleet add-node)"
    )
    p.add_argument("--interface", default="127.0.0.1", help="address to listen and announce on")
    p.add_argument("--port", type=int, default=0, help="TCP port (0: any free port)")
    p.add_argument(
        "--seed",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="member to exchange peers with (networks without multicast); repeatable",
    )
    p.add_argument("--no-mdns", action="store_true", help="find peers through --seed only")
    p.add_argument(
        "--settle",
        type=finite,
        default=settle,
        help=f"seconds to find peers before subscribing (default {settle})",
    )
    p.add_argument("--quiet", action="store_true", help="only errors on stderr")
    p.add_argument("--service-type", default=SERVICE_TYPE, help=argparse.SUPPRESS)
    p.add_argument("--telemetry", type=path_arg, metavar="SPOOL_DIR", help="record telemetry here")
    p.add_argument("--collector", metavar="HOST:PORT", help="upload telemetry to this collector")
    p.add_argument(
        "--history",
        type=int,
        default=1000,
        metavar="N",
        help="own publications kept for subscribers that resume (default 1000; 0: none)",
    )


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``node``, ``sub``, ``pub`` and ``status`` subcommands."""
    node = sub.add_parser("node", help="run one node on the network (mDNS discovery)")
    _common(node)
    node.add_argument("--subscribe", action="append", default=[], metavar="TOPIC")
    node.add_argument("--publish", metavar="TOPIC", help="publish on TOPIC (subscribes to it)")
    node.add_argument("--count", type=int, default=10, help="publications to make (default 10)")
    node.add_argument("--rate", type=finite, default=1.0, help="publications per second")
    node.add_argument("--payload-size", type=int, default=0, help="pad payloads to this size")
    node.add_argument("--duration", type=finite, help="seconds to run (default: until Ctrl-C)")
    node.add_argument("--trace", type=path_arg, help="write TRACE.jsonl here")
    node.add_argument(
        "--stats-every",
        type=finite,
        metavar="SECONDS",
        help="print RSS, threads, sockets, CPU and message rates every SECONDS (stderr)",
    )

    s = sub.add_parser("sub", help="print what topics deliver, one line each")
    _common(s)
    s.add_argument("topics", nargs="+", metavar="TOPIC")
    s.add_argument("--count", type=int, help="exit after this many deliveries")
    s.add_argument("--duration", type=finite, help="exit after this many seconds")
    s.add_argument("--json", action="store_true", help="JSON lines instead of text")

    p = sub.add_parser("pub", help="publish messages (arguments, or stdin lines)")
    _common(p)
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("messages", nargs="*", metavar="MESSAGE", help="default: lines of stdin")
    p.add_argument(
        "--timeout", type=finite, default=30.0, help="seconds to wait for acknowledgements"
    )
    p.add_argument(
        "--min-subscribers",
        type=int,
        default=0,
        metavar="N",
        help="exit 1 unless every message is confirmed by at least N other subscribers",
    )

    st = sub.add_parser("status", help="list the fleet members seen on an interface")
    st.add_argument(
        "--identity", type=path_arg, required=True, help="node directory (fleet add-node)"
    )
    st.add_argument("--interface", default="127.0.0.1", help="interface address to watch")
    st.add_argument("--wait", type=finite, default=3.0, help="seconds to watch (default 3)")
    st.add_argument("--json", action="store_true", help="one JSON object instead of text")
    st.add_argument("--service-type", default=SERVICE_TYPE, help=argparse.SUPPRESS)


def _config(args: argparse.Namespace) -> NodeConfig:
    if not 0 <= args.port < 65536:
        raise P2PError(f"--port must be in 0..65535, got {args.port}")
    if args.settle < 0:
        raise P2PError("--settle must be non-negative")
    if args.history < 0:
        raise P2PError(f"--history must be 0 or more, got {args.history}")
    if args.no_mdns and not args.seed:
        raise P2PError("--no-mdns needs at least one --seed HOST:PORT")
    for seed in args.seed:
        parse_address(seed)
    check_listen(args.interface, args.port)
    _check_files()
    return NodeConfig(
        interface=args.interface,
        port=args.port,
        discovery=not args.no_mdns,
        seeds=tuple(args.seed),
        service_type=args.service_type,
        telemetry_dir=args.telemetry,
        telemetry_collector=args.collector,
        history_count=args.history,
    )


MIN_FILES = 64
"""Open files a node needs at the least (sockets, zeroconf, trio, key files); below
this, zeroconf's thread can fail so that starting discovery never returns."""


def _check_files() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < MIN_FILES:
        raise CommandError(
            f"too many open files: this process may open {soft}, a node needs at least "
            f"{MIN_FILES} (raise it with `ulimit -n`)"
        )


def check_listen(interface: str, port: int) -> None:
    """Fail early, naming the flag, if ``interface`` is not local or ``port`` is taken
    (the runtime's own bind errors stay the fallback if this races)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(interface, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise P2PError(f"--interface {interface!r} is not an address ({exc})") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener will
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise P2PError(
                    f"--interface {interface} is not an address of this machine"
                ) from None
            if exc.errno == errno.EADDRINUSE:
                raise CommandError(
                    f"--port {port} on {interface} is already in use by another process"
                ) from None
            raise


class _BriefFormatter(logging.Formatter):
    """Log records with their exception as one line (``--debug``: the traceback):
    a user reads what failed, not where in trio it did."""

    def formatException(self, ei: Any) -> str:  # noqa: N802 (logging's name)
        return f"  ({ei[0].__name__}: {ei[1]})"


def _logging(args: argparse.Namespace, default: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    fmt = "%(asctime)s %(name)s %(levelname)s %(message)s"
    debug = getattr(args, "debug", False)
    handler.setFormatter(logging.Formatter(fmt) if debug else _BriefFormatter(fmt))
    logging.basicConfig(level=logging.ERROR if args.quiet else default, handlers=[handler])


class _Trace:
    """Writes trace lines as events happen (flushed, so a killed node keeps its trace)."""

    def __init__(self, fh: IO[str] | None, node: list[int]) -> None:
        self.fh = fh
        self.node = node
        self.view_of: Callable[[str], frozenset[int]] | None = None
        """The node's subscribers of a topic: a ``publish`` line carries them
        (``view``), so ``p2p check`` owes the publication to those only."""

    def __call__(
        self, event: str, topic: str, source: int | None, seq: int | None, inc: int
    ) -> None:
        if self.fh is None:
            return
        line = {
            "time": time.time(),
            "node": f"{self.node[0]:016x}",
            "event": event,
            "topic": topic,
            "source": f"{source:016x}" if source is not None else f"{self.node[0]:016x}",
            "seq": seq,
            "inc": inc,
        }
        if event == "publish" and self.view_of is not None:
            line["view"] = [f"{n:016x}" for n in sorted(self.view_of(topic))]
        self.fh.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.fh.flush()


def _check(args: argparse.Namespace) -> None:
    if args.rate <= 0 or args.count < 0:
        raise P2PError("--rate must be positive and --count non-negative")
    if args.duration is not None and args.duration <= 0:
        raise P2PError("--duration must be positive")
    if not 0 <= args.payload_size <= 1 << 16:
        raise P2PError("--payload-size must be in 0..65536")
    if args.stats_every is not None and not args.stats_every > 0:
        raise P2PError("--stats-every must be positive")


def cmd_node(args: argparse.Namespace) -> int:
    """``p2p node``: run until ``--duration`` ends or Ctrl-C."""
    _check(args)
    cfg = _config(args)
    _logging(args)
    fh = open(args.trace, "w", encoding="utf-8") if args.trace else None  # noqa: SIM115
    try:
        return trio.run(_run, args, cfg, fh)
    finally:
        if fh is not None:
            fh.close()


async def _run(args: argparse.Namespace, cfg: NodeConfig, fh: IO[str] | None) -> int:
    me: list[int] = [0]
    trace = _Trace(fh, me)
    counts = {"delivered": 0, "published": 0}
    async with graceful(args.duration) as stop, open_node(args.identity, cfg, trace=trace) as node:
        me[0] = node.id
        trace.view_of = lambda topic: node.core.view(topic)  # the current life's core
        stats = node.stats
        with stop.scope:
            await _node_body(node, args, counts)
        # Publications still waiting for a predecessor when the node stops.
        stats = {**stats, "held_back": sum(node.core.held_back(t) for t in node.machine.topics)}
    _say(args, f"stopped: {counts['delivered']} deliveries; {_troubles(stats)}")
    return stop.exit_code


_TROUBLES = (
    "suspicions",
    "reincarnations",
    "loop_stalls",
    "outbox_overflow",
    "lost_on_disconnect",
    "lost_to_crash",
    "missed",
    "recovered",
    "sent_to_crashed",
    "control_dropped",
    "frames_resent",
    "rejected_connections",
    "malformed_payload",
    "held_back",
)


def _troubles(stats: dict[str, int]) -> str:
    """The counters that tell of trouble (``Node.stats``), those above zero:
    one line a user (or a fleet benchmark) can read after a run."""
    bad = [f"{k} {stats[k]}" for k in _TROUBLES if stats.get(k)]
    return ", ".join(bad) if bad else "no suspicions, losses or resends"


async def _node_body(node: Node, args: argparse.Namespace, counts: dict[str, int]) -> None:
    topics = list(dict.fromkeys([*args.subscribe, *([args.publish] if args.publish else [])]))
    async with trio.open_nursery() as nursery:
        if args.stats_every is not None:
            nursery.start_soon(print_stats, args.stats_every, counts)
        await _settle(node, args)
        for topic in topics:
            sub = await node.subscribe(topic)
            _say(args, f"subscribed to {topic!r} ({len(node.core.view(topic))} members)")
            nursery.start_soon(_drain, sub, counts)
        if args.publish:
            await _publish(node, args, counts)
            _say(args, f"published {args.count} on {args.publish!r}")
        await trio.sleep_forever()


async def _drain(sub: Subscription, counts: dict[str, int]) -> None:
    async for _ in sub:
        counts["delivered"] += 1


async def _publish(node: Node, args: argparse.Namespace, counts: dict[str, int]) -> None:
    start = trio.current_time()
    for i in range(args.count):
        body = f"{node.id:016x}:{i}".encode()
        await node.publish(args.publish, body.ljust(args.payload_size, b"."))
        counts["published"] += 1
        await trio.sleep_until(start + (i + 1) / args.rate)  # --rate on average, not slower


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(f"p2p {args.command}: {text}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------- p2p sub


def cmd_sub(args: argparse.Namespace) -> int:
    """``p2p sub``: print deliveries until ``--count``, ``--duration`` or Ctrl-C."""
    cfg = _config(args)
    if args.count is not None and args.count <= 0:
        raise P2PError("--count must be positive")
    if args.duration is not None and args.duration <= 0:
        raise P2PError("--duration must be positive")
    _logging(args, logging.WARNING)
    return trio.run(_sub, args, cfg)


async def _sub(args: argparse.Namespace, cfg: NodeConfig) -> int:
    left = [args.count if args.count is not None else -1]
    async with graceful(args.duration) as stop, open_node(args.identity, cfg) as node:
        with stop.scope:
            await _settle(node, args)
            async with trio.open_nursery() as nursery:
                for topic in args.topics:
                    sub = await node.subscribe(topic)
                    _say(args, f"subscribed to {topic!r}")
                    nursery.start_soon(_print_deliveries, sub, args.json, left, nursery)
    return stop.exit_code


async def _print_deliveries(
    sub: Subscription, as_json: bool, left: list[int], nursery: trio.Nursery
) -> None:
    async for d in sub:
        if d.missed:  # the gap event: never skipped silently
            print(
                f"p2p sub: missed {d.missed} publications of {d.source:016x} on {d.topic!r}",
                file=sys.stderr,
                flush=True,
            )
        try:
            print(_format(d, as_json), flush=True)
        except BrokenPipeError:  # the reader left (``| head -1``): stop as --count would
            # Later flushes (at exit too) must not fail on the closed pipe again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            nursery.cancel_scope.cancel()
            return
        left[0] -= 1
        if left[0] == 0:
            nursery.cancel_scope.cancel()


def _format(d: Delivery, as_json: bool) -> str:
    """One output line for a delivery (JSON: payload as text if UTF-8, else base64)."""
    if not as_json:
        text = d.payload.decode("utf-8", errors="backslashreplace")
        return f"{d.topic} {d.source:016x} {d.seq} {text}"
    line: dict[str, object] = {"topic": d.topic, "source": f"{d.source:016x}", "seq": d.seq}
    if d.missed:
        line["missed"] = d.missed
    try:
        line["payload"] = d.payload.decode("utf-8")
    except UnicodeDecodeError:
        line["payload_b64"] = base64.b64encode(d.payload).decode()
    return json.dumps(line, ensure_ascii=False)


async def _settle(node: Node, args: argparse.Namespace) -> None:
    _say(args, f"node {node.id:016x} listening on {args.interface}:{node.port}")
    await trio.sleep(args.settle)
    _say(args, f"{len(node.members()) - 1} peers found")


# ----------------------------------------------------------------- p2p pub


def cmd_pub(args: argparse.Namespace) -> int:
    """``p2p pub``: publish each message, wait for its ACK wave, and report how many
    other subscribers confirmed it (exit 1 below ``--min-subscribers``)."""
    cfg = _config(args)
    if args.timeout <= 0:
        raise P2PError("--timeout must be positive")
    if args.min_subscribers < 0:
        raise P2PError("--min-subscribers must be non-negative")
    # Bytes as given: argv and stdin need not be UTF-8 (undecodable input
    # raised a UnicodeEncodeError traceback when the text was encoded back).
    messages = [os.fsencode(m) for m in args.messages] or [
        line.rstrip(b"\n") for line in sys.stdin.buffer
    ]
    if not messages:
        raise P2PError("nothing to publish (no MESSAGE arguments and empty stdin)")
    limit = cfg.pubsub.max_payload
    for i, size in enumerate(map(len, messages), 1):
        if size > limit:
            raise P2PError(f"message {i} is {size} bytes: over the payload limit of {limit} bytes")
    _logging(args, logging.WARNING)
    return trio.run(_pub, args, cfg, messages)


async def _pub(args: argparse.Namespace, cfg: NodeConfig, messages: list[bytes]) -> int:
    confirmed: list[int] = []
    async with graceful() as stop, open_node(args.identity, cfg) as node:
        with stop.scope:
            await _settle(node, args)
            with trio.move_on_after(args.timeout) as waited:
                sub = await node.subscribe(args.topic)
                async with trio.open_nursery() as nursery:
                    # The publisher's own copies: unread, they filled the
                    # subscription and logged "deliveries dropped" errors.
                    nursery.start_soon(_drain, sub, {"delivered": 0})
                    for payload in messages:
                        confirmed.append(await _publish_confirmed(node, args.topic, payload))
                    nursery.cancel_scope.cancel()
    if stop.signum is not None:
        return stop.exit_code
    if waited.cancelled_caught:
        raise CommandError(
            f"message {len(confirmed) + 1} not acknowledged within --timeout {args.timeout} s"
        )
    _report_confirmations(args, confirmed)
    return 0


async def _publish_confirmed(node: Node, topic: str, payload: bytes) -> int:
    """Publish ``payload`` and wait for its ACK wave; the number of *other* subscribers
    that confirmed it: those the publisher knew before publishing and still knows
    once the wave is back (the wave completes without a subscriber that failed)."""
    before = node.core.view(topic) - {node.id}
    mid = await node.publish(topic, payload, wait_acked=True)
    return len(before & node.acked_views.pop(mid, node.core.view(topic)))


def _report_confirmations(args: argparse.Namespace, confirmed: list[int]) -> None:
    """Say what was confirmed; raise :class:`CommandError` below ``--min-subscribers``."""
    low, high = min(confirmed), max(confirmed)
    counts = f"{low}" if low == high else f"{low} to {high}"
    _say(args, f"published {len(confirmed)} on {args.topic!r}: each confirmed by {counts} "
         f"other subscriber{'' if high == 1 else 's'}")  # fmt: skip
    if high == 0:
        print(
            f"p2p pub: warning: no other subscriber of {args.topic!r} was found: "
            "nobody received the messages",
            file=sys.stderr,
            flush=True,
        )
    if low < args.min_subscribers:
        worst = confirmed.index(low) + 1
        raise CommandError(
            f"message {worst} was confirmed by {low} other subscriber{'' if low == 1 else 's'}, "
            f"fewer than --min-subscribers {args.min_subscribers}"
        )


# -------------------------------------------------------------- p2p status


def cmd_status(args: argparse.Namespace) -> int:
    """``p2p status``: this identity, and the members announcing on the interface."""
    if args.wait <= 0:
        raise P2PError("--wait must be positive")
    _check_files()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    identity, fleet = load_node(args.identity)
    peers, stop = trio.run(_watch, args, identity.node_id, fleet)
    if stop.signum is not None:
        return stop.exit_code
    name = identity.certificate.name if identity.certificate else None
    me = {"id": f"{identity.node_id:016x}", "name": name, "fleet": fleet.name, "mode": fleet.mode}
    if args.json:
        print(json.dumps({"node": me, "members": [_peer(p) for p in peers]}))
        return 0
    print(f"node {me['id']} ({name or 'no name'}) in fleet {fleet.name!r} ({fleet.mode} mode)")
    print(f"{len(peers)} members announcing on {args.interface}:")
    for p in peers:
        info = _peer(p)
        print(f"  {info['id']}  {info['host']}:{info['port']}  record {info['age_s']} s old")
    return 0


def _peer(p: Peer) -> dict[str, object]:
    return {
        "id": f"{p.node_id:016x}",
        "host": p.host,
        "port": p.port,
        "age_s": max(0, round(time.time() - p.issued_at)),
    }


async def _watch(
    args: argparse.Namespace, node_id: int, fleet: Fleet
) -> tuple[list[Peer], Shutdown]:
    """Peers whose verified records appear within ``--wait`` seconds (we never announce)."""

    found: dict[int, Peer] = {}
    discovery = Discovery(
        interface=args.interface,
        node_id=node_id,
        port=9,  # never announced
        record=b"-",
        verify=partial(verified_peer, fleet),
        service_type=args.service_type,
        announce=False,
    )
    async with graceful(args.wait) as stop, discovery:
        with stop.scope:
            async for event in discovery.events():
                if event.kind == "up":
                    found[event.peer.node_id] = event.peer
                else:
                    found.pop(event.peer.node_id, None)
    return sorted(found.values(), key=lambda p: p.node_id), stop


__all__ = ["Delivery", "add_parser", "check_listen", "cmd_node", "cmd_pub", "cmd_status", "cmd_sub"]

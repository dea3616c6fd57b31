"""One node of one system per process, driven by ``bench.runtime`` over stdin/stdout.

Run as ``python -m bench._runtime_workers SPEC_JSON`` (the parent does it).  A
worker speaks JSON lines on stdout and reads one-word commands on stdin; every
system goes through the same steps:

1. set up its transport and find the other nodes, then print ``up``;
2. on ``sub``: subscribe (and, publishing, wait until its subscribers are
   there where the system can tell), then print ``subscribed``;
3. on ``go T0``: publish from wall-clock time ``T0`` (ns) for ``duration``
   seconds, paced at ``rate`` messages/s or, with ``rate == 0``, as fast as the
   system's own flow control lets it; receive until ``duration + drain``;
   print ``result``;
4. on ``exit`` (or end of input): close and exit.

Payloads are 64 bytes: the send time (``time.time_ns()``, one clock for every
process on a host), a per-source sequence number, the source's index, padding.
Systems: ``ours`` (:func:`p2p.runtime.open_node`, mDNS discovery, PSK fleet,
causal order and encryption always on), ``zmq`` (pyzmq XPUB/SUB over TCP) and
``zenoh`` (eclipse-zenoh in peer mode over TCP).

``python -m bench._runtime_workers inprocess MESSAGES {off,on,noop}`` is a
separate diagnostic, not driven by the parent: three of our nodes in this one
process, a 1 -> 2 fan-out of MESSAGES publications, with telemetry off, on,
or on with the recorder's calls replaced by no-ops (what the node's own
bookkeeping costs).  Nothing periodic runs during it, so under
``valgrind --tool=callgrind`` the instruction count of two runs with
different MESSAGES gives instructions per message (``docs/telemetry.md``).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

STARTED_NS = time.time_ns()
"""Wall clock when this module started running (after the interpreter's start-up)."""

FLOORS = ("floor", "stream")
"""Not systems but floors: our tree over trio and TCP alone (``bench._floor_worker``)."""
PAYLOAD_SIZE = 64
HEADER = struct.Struct("<QQI")
"""Send time (ns), sequence number, source index; padded to :data:`PAYLOAD_SIZE`."""
PAD = bytes(PAYLOAD_SIZE - HEADER.size)
TOPIC = "bench/t"
ZMQ_PREFIX = b"bench/t "
OURS_WINDOW_ROUNDS = 4
"""Flat-out publishing on ``ours``: most publications queued behind the round in
flight, in rounds of ``max_round_messages``."""
PROFILE_ENV = "BENCH_RUNTIME_PROFILE"
PUBLISH_CHUNK = 32
"""Publications per ``Node.publish_many`` call (``p2p.runtime._node.PUBLISH_BATCH``): each
payload's send time is taken just before its call, not a whole queue earlier."""
MAX_LATENCY_SAMPLES = 20_000
"""Latency samples a worker sends back (a uniform stride beyond this)."""


@dataclass(frozen=True, slots=True)
class Spec:
    """What one worker does; built by the parent, passed as JSON on the command line."""

    system: str
    index: int
    nodes: int
    publish: bool
    subscribe: bool
    rate: float
    """Messages/s; 0 publishes as fast as flow control allows."""
    duration: float
    """Seconds of publishing from ``go``."""
    warmup: float
    """Seconds at the start of publishing left out of rates and latencies."""
    drain: float
    """Seconds after publishing ends for the last messages to arrive."""
    ports: list[int] = field(default_factory=list)
    """``zmq``/``zenoh``: the TCP port of every node, by index."""
    publishers: list[int] = field(default_factory=list)
    """Indices of the publishing nodes."""
    node_dir: str = ""
    service_type: str = ""
    trace: str = ""
    """``ours``: write the node's trace (``time event source seq`` lines) here."""
    round_messages: int = 0
    """``ours``: ``PubSubConfig.max_round_messages`` (0: the library's default)."""
    seeds: bool = False
    """``ours``: find peers through static seeds (every other node) instead of mDNS."""
    telemetry_dir: str = ""
    """``ours``: record telemetry into this spool directory (``NodeConfig.telemetry_dir``)."""
    telemetry_window: float = 0.0
    """``ours``: seconds per telemetry window (0: the library's default)."""
    children: list[int] = field(default_factory=list)
    """``floor``/``stream``: this node's children (indices) in the tree our
    nodes build from node 0 (``bench._floor_worker``)."""

    @staticmethod
    def from_json(text: str) -> Spec:
        """The spec the parent serialised with ``dataclasses.asdict``."""
        return Spec(**json.loads(text))


# ------------------------------------------------------------------ control


def emit(event: str, **data: Any) -> None:
    """One JSON line to the parent."""
    sys.stdout.write(json.dumps({"ev": event, "ns": time.time_ns(), **data}) + "\n")
    sys.stdout.flush()


def command() -> list[str]:
    """The parent's next command (``["exit"]`` at end of input)."""
    line = sys.stdin.readline()
    return line.split() or ["exit"]


def expect(word: str) -> list[str]:
    """Wait for command ``word``; exit the process on ``exit``."""
    cmd = command()
    if cmd[0] == "exit":
        raise SystemExit(0)
    if cmd[0] != word:
        raise RuntimeError(f"expected {word!r} from the parent, got {cmd!r}")
    return cmd


# ---------------------------------------------------------------- measuring


def payload(seq: int, source: int) -> bytes:
    """A 64-byte payload stamped with the send time."""
    return HEADER.pack(time.time_ns(), seq, source) + PAD


class Recorder:
    """What one node receives: counts, order per source, latency, first arrival."""

    def __init__(self, me: int, window: tuple[int, int]) -> None:
        self.me = me
        self.lo, self.hi = window
        self.count = 0
        self.in_window = 0
        self.first_ns = 0
        self.latencies: list[int] = []
        self.last: dict[int, int] = {}
        self.first: dict[int, int] = {}
        self.per_source: dict[int, int] = {}
        self.order_violations = 0

    def on(self, data: bytes) -> None:
        """One received payload (own publications are ignored)."""
        now = time.time_ns()
        sent, seq, src = HEADER.unpack_from(data)
        if src == self.me:
            return
        if not self.count:
            self.first_ns = now
        self.count += 1
        if self.lo <= now < self.hi:
            self.in_window += 1
        if self.lo <= sent < self.hi:
            self.latencies.append(now - sent)
        last = self.last.get(src)
        if last is None:
            self.first[src] = seq
            self.per_source[src] = 1
        else:
            self.per_source[src] += 1
            if seq <= last:
                self.order_violations += 1
        self.last[src] = seq

    def summary(self) -> dict[str, Any]:
        """Counts, per-source ranges, latency samples (µs, strided down to at most
        :data:`MAX_LATENCY_SAMPLES`) and the p99 of each half of the window."""
        lat = self.latencies
        stride = max(1, -(-len(lat) // MAX_LATENCY_SAMPLES))
        half = len(lat) // 2
        return {
            "count": self.count,
            "in_window": self.in_window,
            "first_ns": self.first_ns,
            "order_violations": self.order_violations,
            "sources": {
                str(s): {"first": self.first[s], "last": self.last[s], "count": n}
                for s, n in self.per_source.items()
            },
            "latency_us": [x // 1000 for x in lat[::stride]],
            "latency_samples": len(lat),
            "p99_halves_us": [_p99(lat[:half]) // 1000, _p99(lat[half:]) // 1000],
        }


def _p99(values: list[int]) -> int:
    """Nearest-rank 99th percentile (0 when empty)."""
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class Pacer:
    """Deadline pacing: message ``i`` is due at ``start + i / rate``; late ones go in a burst."""

    def __init__(self, rate: float, start_ns: int) -> None:
        self.period_ns = 1e9 / rate
        self.start_ns = start_ns
        self.sent = 0
        self.max_burst = 0

    def due(self, now_ns: int) -> int:
        """How many messages are due at ``now_ns`` (counted as sent)."""
        target = int((now_ns - self.start_ns) / self.period_ns) + 1
        n = max(0, target - self.sent)
        self.sent += n
        self.max_burst = max(self.max_burst, n)
        return n

    def next_ns(self) -> int:
        """When the next message is due."""
        return self.start_ns + int(self.sent * self.period_ns)


@dataclass(slots=True)
class Sent:
    """What one node published."""

    count: int = 0
    in_window: int = 0
    blocked: int = 0
    """Times the publisher waited for flow control."""
    max_burst: int = 0

    def summary(self) -> dict[str, Any]:
        """The counters as a JSON object."""
        return {
            "count": self.count,
            "in_window": self.in_window,
            "blocked": self.blocked,
            "max_burst": self.max_burst,
        }


def window(spec: Spec, start_ns: int) -> tuple[int, int]:
    """The steady-state window: publishing time minus the warm-up."""
    return start_ns + int(spec.warmup * 1e9), start_ns + int(spec.duration * 1e9)


def run_blocking_publisher(
    spec: Spec, start_ns: int, send: Callable[[bytes], bool], sent: Sent
) -> None:
    """Publish from ``start_ns`` for ``spec.duration`` s with ``send`` (a thread's loop).

    ``send`` returns ``False`` when flow control refused the message; it is
    retried after a short wait.
    """
    lo, hi = window(spec, start_ns)
    _sleep_until(start_ns)
    pacer = Pacer(spec.rate, start_ns) if spec.rate > 0 else None
    seq = 0
    while (now := time.time_ns()) < hi:
        n = pacer.due(now) if pacer else 64
        for _ in range(n):
            data = payload(seq, spec.index)
            while not send(data):
                sent.blocked += 1
                time.sleep(0.0002)
            if lo <= HEADER.unpack_from(data)[0] < hi:
                sent.in_window += 1
            seq += 1
        if pacer:
            _sleep_until(min(pacer.next_ns(), hi))
    sent.count = seq
    sent.max_burst = pacer.max_burst if pacer else 0


def _sleep_until(t_ns: int) -> None:
    """Block until wall-clock time ``t_ns``."""
    delay = (t_ns - time.time_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)


class GcPauses:
    """Pauses of the cyclic garbage collector in this process (``gc.callbacks``)."""

    def __init__(self) -> None:
        import gc

        self.count = 0
        self.total_s = 0.0
        self.max_s = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        pause = time.perf_counter() - self._t0
        self.count += 1
        self.total_s += pause
        self.max_s = max(self.max_s, pause)

    def reset(self) -> None:
        """Forget the collections so far."""
        self.count, self.total_s, self.max_s = 0, 0.0, 0.0

    def summary(self) -> dict[str, float]:
        """Collections, their total and longest pause (ms)."""
        return {"count": self.count, "total_ms": 1e3 * self.total_s, "max_ms": 1e3 * self.max_s}


GC = GcPauses()
"""Collections since ``go`` (:func:`mark` resets it)."""


def cpu_s() -> float:
    """CPU seconds (user + system, every thread) of this process so far."""
    t = os.times()
    return t.user + t.system


def process_info(at_go: tuple[float, float, float]) -> dict[str, Any]:
    """CPU and wall seconds since ``go`` (``at_go`` is :func:`mark`), CPU in all, peak RSS."""
    import resource

    cpu, wall = cpu_s(), time.monotonic()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "cpu_s": cpu,
        "cpu_run_s": cpu - at_go[0],
        "sys_run_s": os.times().system - at_go[2],
        "wall_run_s": wall - at_go[1],
        "peak_rss_mb": peak,
        "gc": GC.summary(),
    }


def mark() -> tuple[float, float, float]:
    """CPU and monotonic wall seconds now, and the system part of the CPU
    seconds (for :func:`process_info`); resets :data:`GC`."""
    GC.reset()
    return cpu_s(), time.monotonic(), os.times().system


# --------------------------------------------------------------------- ours


def run_ours(spec: Spec) -> None:
    """A node of this library: mDNS discovery on loopback, PSK fleet, trio.

    With ``BENCH_RUNTIME_PROFILE=DIR`` in the environment the node runs under
    cProfile and writes ``DIR/<label>-<index>.prof`` (``python -m pstats`` reads it).
    """
    import trio

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    out = os.environ.get(PROFILE_ENV)
    if not out:
        trio.run(_ours_main, spec)
        return
    import cProfile

    profile = cProfile.Profile()
    try:
        profile.runcall(trio.run, _ours_main, spec)
    finally:
        label = os.environ.get("BENCH_RUNTIME_LABEL", "ours")
        profile.dump_stats(os.path.join(out, f"{label}-{spec.index}.prof"))


async def _ours_main(spec: Spec) -> None:
    """Run our node, with its trace written to ``spec.trace`` if given."""
    with open(spec.trace or os.devnull, "w", encoding="utf-8", buffering=1 << 20) as trace:
        await _ours_node(spec, _trace_hook(trace) if spec.trace else None)
    # Closed when the node has stopped; the parent reads it once every worker has exited.


async def _ours_node(
    spec: Spec, hook: Callable[[str, str, int | None, int | None, int], None] | None
) -> None:
    """One node through the worker's steps (see the module docstring)."""
    import trio

    from p2p.runtime import open_node

    imported = time.time_ns()
    async with open_node(spec.node_dir, _ours_config(spec), trace=hook) as node:
        with trio.fail_after(60):
            while len(node.members()) < spec.nodes:
                await trio.sleep(0.01)
        emit("up", id=f"{node.id:016x}", imported_ns=imported, started_ns=STARTED_NS)
        await _ours_command("sub")
        # Without its own publications where the library can (as Zenoh's
        # subscribers, Locality.REMOTE); a base checkout without it drops them.
        own_param = "own" in inspect.signature(node.subscribe).parameters
        sub = await (node.subscribe(TOPIC, own=False) if own_param else node.subscribe(TOPIC))
        emit("subscribed")
        start_ns = int((await _ours_command("go"))[1])
        at_go = mark()
        rec = Recorder(spec.index, window(spec, start_ns))
        sent = Sent()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_ours_receive, sub, rec)
            if spec.publish:
                await _ours_publish(node, spec, start_ns, sent)
            await _trio_sleep_until(start_ns + int((spec.duration + spec.drain) * 1e9))
            nursery.cancel_scope.cancel()
        stats = dict(node.stats, subscription_dropped=sub.dropped, **_core_info(node))
        emit(
            "result",
            recv=rec.summary(),
            sent=sent.summary(),
            stats=stats,
            **process_info(at_go),
        )
        await _ours_command("exit")


def _trace_hook(fh: IO[str]) -> Callable[[str, str, int | None, int | None, int], None]:
    """Trace events as ``time event source seq`` lines (``-`` for none), written as they
    happen: kept in memory they would grow the heap the garbage collector walks."""

    def hook(event: str, topic: str, source: int | None, seq: int | None, inc: int) -> None:
        fh.write(f"{time.time()!r} {event} {'-' if source is None else source} "
                 f"{'-' if seq is None else seq}\n")  # fmt: skip

    return hook


def _ours_config(spec: Spec) -> Any:
    """The node's settings: defaults, mDNS with the run's service type or static seeds,
    and telemetry if the spec asks for it."""
    from p2p.runtime import NodeConfig
    from topics import PubSubConfig

    options: dict[str, Any] = {"pubsub": PubSubConfig()}
    if spec.round_messages:
        options["pubsub"] = PubSubConfig(max_round_messages=spec.round_messages)
    if spec.telemetry_dir:
        options["telemetry_dir"] = spec.telemetry_dir
        if spec.telemetry_window:
            options["telemetry_window"] = spec.telemetry_window
    if not spec.seeds:
        return NodeConfig(service_type=spec.service_type, **options)
    seeds = tuple(f"127.0.0.1:{p}" for i, p in enumerate(spec.ports) if i != spec.index)
    return NodeConfig(port=spec.ports[spec.index], discovery=False, seeds=seeds, **options)


async def _ours_command(word: str) -> list[str]:
    """:func:`expect` without blocking the trio loop."""
    import trio

    cmd: list[str] = await trio.to_thread.run_sync(command)
    if cmd[0] == "exit" and word != "exit":
        raise SystemExit(0)
    if cmd[0] != word:
        raise RuntimeError(f"expected {word!r} from the parent, got {cmd!r}")
    return cmd


async def _trio_sleep_until(t_ns: int) -> None:
    """Sleep until wall-clock time ``t_ns``."""
    import trio

    await trio.sleep(max(0.0, (t_ns - time.time_ns()) / 1e9))


async def _ours_receive(sub: Any, rec: Recorder) -> None:
    """Record every delivery but the node's own publications, a batch per
    wake-up where the library offers batches (``Subscription.batches``)."""
    batches = getattr(sub, "batches", None)
    if batches is None:
        async for d in sub:
            if not d.own:
                rec.on(d.payload)
        return
    on = rec.on
    async for batch in batches():
        for d in batch:
            if not d.own:
                on(d.payload)


async def _ours_publish(node: Any, spec: Spec, start_ns: int, sent: Sent) -> None:
    """Paced, or flat out keeping at most :data:`OURS_WINDOW_ROUNDS` rounds queued."""
    import trio

    lo, hi = window(spec, start_ns)
    await _trio_sleep_until(start_ns)
    pacer = Pacer(spec.rate, start_ns) if spec.rate > 0 else None
    core, seq = node.core, 0
    limit = OURS_WINDOW_ROUNDS * node.config.pubsub.max_round_messages
    many = getattr(node, "publish_many", None)  # the batch API, where the library has it
    while (now := time.time_ns()) < hi:
        if pacer:
            n = pacer.due(now)
        else:
            n = limit - core.queued(TOPIC)
            if n <= 0:
                sent.blocked += 1
                await trio.sleep(0.0005)
                continue
        for first in range(seq, seq + n, PUBLISH_CHUNK):  # stamped just before publishing
            batch = [
                payload(i, spec.index) for i in range(first, min(first + PUBLISH_CHUNK, seq + n))
            ]
            if many is not None:
                await many(TOPIC, batch)
            else:
                for data in batch:
                    await node.publish(TOPIC, data)
            sent.in_window += sum(lo <= HEADER.unpack_from(data)[0] < hi for data in batch)
        seq += n
        if pacer:
            await _trio_sleep_until(min(pacer.next_ns(), hi))
        else:
            await trio.sleep(0)
    sent.count = seq
    sent.max_burst = pacer.max_burst if pacer else 0


def _core_info(node: Any) -> dict[str, int]:
    """The core's hold-back and queue counters (non-zero ones point at a backlog)."""
    core = node.core
    return {
        "core_pending_max": core.pending_max,
        "core_holds": core.holds,
        "core_queued_at_end": core.queued(TOPIC),
        "core_held_back_at_end": core.held_back(TOPIC),
    }


# ---------------------------------------------------------------------- zmq


def run_zmq(spec: Spec) -> None:
    """pyzmq: each publisher binds an XPUB (no drop: flow control), subscribers connect."""
    import zmq

    imported = time.time_ns()
    ctx = zmq.Context()
    pub = sub = None
    try:
        if spec.publish:
            pub = ctx.socket(zmq.XPUB)
            pub.setsockopt(zmq.XPUB_NODROP, 1)
            pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # one subscription message per subscriber
            pub.setsockopt(zmq.LINGER, 0)
            pub.bind(f"tcp://127.0.0.1:{spec.ports[spec.index]}")
        if spec.subscribe:
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            for p in spec.publishers:
                if p != spec.index:
                    sub.connect(f"tcp://127.0.0.1:{spec.ports[p]}")
        emit("up", imported_ns=imported, started_ns=STARTED_NS)
        expect("sub")
        if sub is not None:
            sub.setsockopt(zmq.SUBSCRIBE, ZMQ_PREFIX)
        if pub is not None:  # an XPUB sees its subscriptions: wait for all of them
            pub.setsockopt(zmq.RCVTIMEO, 60_000)
            for _ in range(spec.nodes - 1):
                pub.recv()  # zmq.Again after a minute without one
        emit("subscribed")
        start_ns = int(expect("go")[1])
        at_go = mark()

        def send(data: bytes) -> bool:
            assert pub is not None
            try:
                pub.send(ZMQ_PREFIX + data, zmq.NOBLOCK)
            except zmq.Again:
                return False
            return True

        rec = Recorder(spec.index, window(spec, start_ns))

        def receive(stop: threading.Event) -> None:
            assert sub is not None
            skip = len(ZMQ_PREFIX)
            poller = zmq.Poller()
            poller.register(sub, zmq.POLLIN)
            while not stop.is_set():
                if poller.poll(50):
                    while True:
                        try:
                            msg = sub.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        rec.on(msg[skip:])

        has_pub, has_sub = pub is not None, sub is not None
        _run_threads(
            spec, start_ns, at_go, rec, send if has_pub else None, receive if has_sub else None
        )
        expect("exit")
    finally:
        for s in (pub, sub):
            if s is not None:
                s.close(0)
        ctx.term()


def _run_threads(
    spec: Spec,
    start_ns: int,
    at_go: tuple[float, float, float],
    rec: Recorder,
    send: Callable[[bytes], bool] | None,
    receive: Callable[[threading.Event], None] | None,
    stop: threading.Event | None = None,
) -> None:
    """Publish with ``send`` in this thread, ``receive`` in another; print the result."""
    sent = Sent()
    thread = None
    stop = stop or threading.Event()
    if receive is not None:
        thread = threading.Thread(target=receive, args=(stop,), daemon=True)
        thread.start()
    if send is not None:
        run_blocking_publisher(spec, start_ns, send, sent)
    _sleep_until(start_ns + int((spec.duration + spec.drain) * 1e9))
    stop.set()
    if thread is not None:
        thread.join(5)
    emit("result", recv=rec.summary(), sent=sent.summary(), stats={}, **process_info(at_go))


# -------------------------------------------------------------------- zenoh


def run_zenoh(spec: Spec) -> None:
    """eclipse-zenoh in peer mode: every node listens on TCP and connects to the others."""
    import zenoh

    imported = time.time_ns()
    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    conf.insert_json5("listen/endpoints", json.dumps([_zenoh_endpoint(spec, spec.index)]))
    others = [_zenoh_endpoint(spec, i) for i in range(spec.nodes) if i != spec.index]
    conf.insert_json5("connect/endpoints", json.dumps(others))
    conf.insert_json5("scouting/multicast/enabled", "false")
    session: Any = zenoh.open(conf)
    try:
        deadline = time.monotonic() + 60
        while len(list(session.info.peers_zid())) < spec.nodes - 1:
            if time.monotonic() > deadline:
                raise RuntimeError("zenoh peers did not all connect")
            time.sleep(0.01)
        emit("up", imported_ns=imported, started_ns=STARTED_NS)
        expect("sub")
        rec_box: list[Recorder] = []
        stop = threading.Event()
        handler = _zenoh_handler(rec_box, stop)
        if spec.subscribe:
            session.declare_subscriber(TOPIC, handler, allowed_origin=zenoh.Locality.REMOTE)
        pub = None
        if spec.publish:
            pub = session.declare_publisher(TOPIC, congestion_control=zenoh.CongestionControl.BLOCK)
        emit("subscribed")
        start_ns = int(expect("go")[1])
        at_go = mark()
        rec = Recorder(spec.index, window(spec, start_ns))
        rec_box.append(rec)  # from now on the callback records (it runs in zenoh's threads)

        def send(data: bytes) -> bool:
            assert pub is not None
            pub.put(data)
            return True

        _run_threads(spec, start_ns, at_go, rec, send if pub is not None else None, None, stop)
        expect("exit")
    finally:
        session.close()


def _zenoh_endpoint(spec: Spec, i: int) -> str:
    """Node ``i``'s TCP endpoint on loopback."""
    return f"tcp/127.0.0.1:{spec.ports[i]}"


def _zenoh_handler(box: list[Recorder], stop: threading.Event) -> Callable[[Any], None]:
    """The subscriber callback; zenoh may call it from several threads (one per link)."""
    lock = threading.Lock()

    def on_sample(sample: Any) -> None:
        if box and not stop.is_set():
            data = sample.payload.to_bytes()
            with lock:
                box[0].on(data)

    return on_sample


# --------------------------------------------------------------- in-process

INPROCESS_MODES = ("off", "on", "noop")


def run_inprocess(messages: int, mode: str) -> dict[str, Any]:
    """Three of our nodes in this process: node 0 publishes ``messages`` 64-byte
    publications flat out (at most :data:`OURS_WINDOW_ROUNDS` rounds queued), the
    other two receive them all; CPU time of the process from the first publication
    to the last delivery.  Telemetry ``off``, ``on`` (default recorder, one spool per
    node) or ``noop`` (on, with ``Recorder.published``, ``delivered`` and
    ``acked_since`` doing nothing).  Peer exchange and telemetry windows are an hour
    apart, so no periodic work grows with the run's wall time (long under valgrind).
    """
    import tempfile
    from pathlib import Path

    import trio

    from p2p.fleet import add_node, init_fleet
    from p2p.runtime import NodeConfig, open_node
    from p2p.telemetry._recorder import Recorder

    if mode not in INPROCESS_MODES or messages < 1:
        raise ValueError(f"need MESSAGES >= 1 and a mode in {INPROCESS_MODES}")
    if mode == "noop":
        Recorder.published = lambda self, topic: None  # type: ignore[method-assign]
        Recorder.delivered = lambda self, topic, latency_ms, holdback_ms: None  # type: ignore[method-assign]
        Recorder.acked_since = lambda self, topic, now, sent: None  # type: ignore[method-assign]

    async def fanout(root: Path) -> float:
        def config(i: int, seeds: tuple[str, ...] = ()) -> NodeConfig:
            if mode == "off":
                return NodeConfig(discovery=False, seeds=seeds, seed_interval=3600.0)
            spool = root / f"spool{i}"
            return NodeConfig(discovery=False, seeds=seeds, seed_interval=3600.0,
                              telemetry_dir=spool, telemetry_window=3600.0)  # fmt: skip

        async with open_node(root / "node0", config(0)) as pub:
            seeds = (f"127.0.0.1:{pub.port}",)
            async with (
                open_node(root / "node1", config(1, seeds)) as a,
                open_node(root / "node2", config(2, seeds)) as b,
            ):
                nodes = (pub, a, b)
                with trio.fail_after(60):
                    while any(len(n.members()) < len(nodes) for n in nodes):
                        await trio.sleep(0.01)
                subs = [await n.subscribe(TOPIC) for n in nodes]
                got = [0, 0]
                done = trio.Event()

                async def receive(sub: Any, i: int) -> None:  # i < 0: the publisher's own
                    async for d in sub:
                        if i >= 0 and not d.own:
                            got[i] += 1
                            if min(got) >= messages:
                                done.set()

                async with trio.open_nursery() as nursery:
                    for i, sub in enumerate(subs):
                        nursery.start_soon(receive, sub, i - 1)
                    await trio.sleep(0.2)
                    t0 = cpu_s()
                    limit = OURS_WINDOW_ROUNDS * pub.config.pubsub.max_round_messages
                    sent = 0
                    many = getattr(pub, "publish_many", None)
                    while sent < messages:
                        room = min(limit - pub.core.queued(TOPIC), messages - sent)
                        pause = 0 if room > 0 else 0.0005
                        while room > 0:
                            take = min(room, PUBLISH_CHUNK)
                            batch = [payload(sent + i, 0) for i in range(take)]
                            if many is not None:
                                await many(TOPIC, batch)
                            else:
                                for data in batch:
                                    await pub.publish(TOPIC, data)
                            sent += take
                            room -= take
                        await trio.sleep(pause)
                    await done.wait()
                    cpu = cpu_s() - t0
                    nursery.cancel_scope.cancel()
        return cpu

    with tempfile.TemporaryDirectory(prefix="bench-inprocess-") as tmp:
        root = Path(tmp)
        init_fleet(root / "fleet", psk=True, name="bench")
        for i in range(3):
            add_node(root / "fleet", root / f"node{i}", name=f"bench{i}")
        cpu = trio.run(fanout, root)
    return {"messages": messages, "mode": mode, "cpu_us_per_msg": 1e6 * cpu / messages}


# --------------------------------------------------------------------- main

RUNNERS: dict[str, Callable[[Spec], None]] = {"ours": run_ours, "zmq": run_zmq, "zenoh": run_zenoh}


def main(argv: list[str]) -> int:
    """Run the worker described by ``argv[0]`` (a :class:`Spec` as JSON), or
    ``inprocess MESSAGES MODE`` (:func:`run_inprocess`)."""
    if argv[:1] == ["inprocess"]:
        if len(argv) != 3 or not argv[1].isdigit() or argv[2] not in INPROCESS_MODES:
            print(f"usage: python -m bench._runtime_workers inprocess MESSAGES "
                  f"{{{','.join(INPROCESS_MODES)}}}", file=sys.stderr)  # fmt: skip
            return 2
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        print(json.dumps(run_inprocess(int(argv[1]), argv[2])))
        return 0
    spec = Spec.from_json(argv[0])
    try:
        RUNNERS[spec.system](spec)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

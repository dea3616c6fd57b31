"""The public :class:`Node` and :func:`open_node`: the application's calls, and
a node's life from listening to a clean close.

:class:`Node` adds the public API to the layers below it (state, the
machine's driver, served connections), and :func:`open_node` runs one for the
duration of an ``async with`` block.  Invariants: subscribing, unsubscribing
and publishing on a node that is not open raise :class:`~p2p.NodeError`, and
payloads are checked (type, ``max_payload``) before any of them is published;
a clean close announces the leave, gives queued packets ``drain_timeout`` to
leave and counts what stays behind; telemetry, when recorded, is closed once.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from causal import MsgId
from p2p._errors import NodeError, P2PError
from p2p._identity import Fleet, NodeIdentity, load_node, lock_identity
from p2p._membership import Peer
from p2p._revocation import REVOKED_FILE
from p2p._transport import is_loopback, parse_address, quiet_accept_errors
from p2p.machine import NodeOutput
from p2p.runtime._config import NodeConfig, TraceHook
from p2p.runtime._delivery import _STAMP, MembershipEvent, Subscription
from p2p.runtime._discovery import Discovery
from p2p.runtime._frontier_file import (
    FRONTIER_FILE,
    FrontierFileError,
    FrontierStore,
)
from p2p.runtime._liveness import incarnation_of
from p2p.runtime._serve import _Server
from topics import Published, PublishedRun

if TYPE_CHECKING:  # imported when a node records telemetry (NodeConfig.telemetry_dir)
    from p2p.telemetry._recorder import Recorder

log = logging.getLogger("p2p.node")

PUBLISH_BATCH = 32
"""Publications :meth:`Node.publish` and :meth:`Node.publish_many` accept between
two schedule points (and the most ``publish_many`` dispatches at once).  Without
them a publisher looping flat out holds the trio loop for as long as its loop
runs (up to a whole queue of rounds), while the round its last ACK wave
released waits for the link writers."""


def _published_id(out: Sequence[NodeOutput]) -> MsgId:
    """The id in the :class:`~topics.Published` among a publication's outputs."""
    first = out[0] if out else None
    if type(first) is Published:  # where the core puts it
        return first.id
    return next(o.id for o in out if isinstance(o, Published))


class Node(_Server):
    """One VCube-PS node on the network.  Create it with :func:`open_node`.

    Membership invariant (kept by :meth:`_up` and :meth:`_down`): the core's
    overlay is ``_alive`` plus this node, and a peer is in ``_alive`` exactly
    when its newest known incarnation (``_incs``) is above the newest one
    handed to ``core.crashed`` (``_dead``).  So the core never routes a SUB
    round through a node it treats as crashed, and a crashed incarnation comes
    back only as a newer one.
    """

    # ------------------------------------------------------------ public API

    def members(self) -> frozenset[int]:
        """The overlay members this node knows and believes up (itself included)."""
        return frozenset(self._alive) | {self.id}

    async def subscribe(self, topic: str, *, own: bool = True) -> Subscription:
        """Join ``topic``; returns once the subscription's ACK wave has come back.

        With ``own=False`` the subscription hands out only other nodes'
        publications (this node's own are published, ordered and kept all
        the same, and still count in the causal order of what it hands out)."""
        self._check_open()
        done = trio.Event()
        out = self.machine.subscribe(topic, trio.current_time())  # raises on misuse
        sub = Subscription(topic, self.config.delivery_buffer, own=own)
        self._subs[topic] = sub
        self._subscribed[topic] = done
        self._trace_event("subscribe", topic, None, None)
        self._handle(out)
        await done.wait()
        return sub

    async def unsubscribe(self, topic: str) -> None:
        """Leave ``topic``; its subscription iterator ends."""
        self._check_open()
        out = self.machine.unsubscribe(topic, trio.current_time())
        self._subs.pop(topic)._close()
        await trio.lowlevel.checkpoint()
        self._trace_event("unsubscribe", topic, None, None)
        self._handle(out)

    async def publish(self, topic: str, payload: bytes, *, wait_acked: bool = False) -> MsgId:
        """Publish on ``topic`` (subscribe first).  Returns once accepted or, with
        ``wait_acked``, once every current subscriber has it (the ACK wave).

        Not a cancellation point unless it waits (``wait_acked``, or for room
        with ``overflow="backpressure"``); a schedule point every
        :data:`PUBLISH_BATCH` publications, so a loop of publications lets the
        node's own tasks (the link writers sending the round just started) run."""
        self._check_open()
        self._check_payload(payload)
        if self.config.overflow == "backpressure":
            await self._wait_for_room()
        now = trio.current_time()
        out = self.machine.publish(topic, _STAMP.pack(time.time()) + payload, now)
        mid = _published_id(out)
        acked: trio.Event | None = None
        if wait_acked:
            acked = self._acked[mid] = trio.Event()
        self._handle(out, now)
        self._streak += 1
        if self._streak >= PUBLISH_BATCH:
            self._streak = 0
            await trio.lowlevel.cancel_shielded_checkpoint()  # accepted: never raises now
        if acked is not None:
            await acked.wait()
        return mid

    async def publish_many(self, topic: str, payloads: Iterable[bytes]) -> list[MsgId]:
        """Publish each of ``payloads`` on ``topic``, in order, as :meth:`publish` would
        one by one, for less per publication: one clock read and one dispatch of
        the core's outputs per :data:`PUBLISH_BATCH` publications, which share
        their publish-time stamp.  Returns their ids.

        Every payload is checked before the first is published, so a bad one
        publishes nothing; with ``overflow="backpressure"`` it waits for room
        once, before the first.  After that it is not a cancellation point: it
        publishes them all (or raises the core's error, e.g. the topic's queue
        is full, with the publications before it published).  Like
        :meth:`publish`, it lets other tasks run every :data:`PUBLISH_BATCH`
        publications, counted across both methods' calls."""
        self._check_open()
        items = list(payloads)
        limit = self.config.pubsub.max_payload
        for payload in items:  # _check_payload's test, in one pass
            if type(payload) is not bytes or len(payload) > limit:
                self._check_payload(payload)  # raises, but for a bytearray that fits
        if self.config.overflow == "backpressure":
            await self._wait_for_room()
        ids: list[MsgId] = []
        for start in range(0, len(items), PUBLISH_BATCH):
            self._check_open()
            now = trio.current_time()
            stamp = _STAMP.pack(time.time())
            out: list[NodeOutput] = []
            chunk = [stamp + payload for payload in items[start : start + PUBLISH_BATCH]]
            try:
                self.machine.publish_many(topic, chunk, now, out)
            finally:  # what was accepted before an error is carried out all the same
                self._handle(out, now)
            for o in out:
                if type(o) is PublishedRun:
                    ids += [m.id for m in o.messages]
                elif type(o) is Published:
                    ids.append(o.id)
            self._streak += min(PUBLISH_BATCH, len(items) - start)
            if self._streak >= PUBLISH_BATCH:
                self._streak = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
        return ids

    def _check_payload(self, payload: object) -> None:
        """Raise unless ``payload`` is bytes of at most ``max_payload`` (a local misuse)."""
        if not isinstance(payload, bytes | bytearray):
            raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
        if len(payload) > self.config.pubsub.max_payload:
            raise NodeError(
                f"payload of {len(payload)} bytes exceeds the limit of "
                f"{self.config.pubsub.max_payload} bytes (PubSubConfig.max_payload)"
            )

    async def _wait_for_room(self) -> None:
        """Wait while some peer's outbox is over half full (``overflow="backpressure"``)."""
        high = self.config.outbox_limit // 2
        while any(len(link.outbox) > high for link in self._links.values()):
            self._room = trio.Event()
            await self._room.wait()
            self._check_open()

    @asynccontextmanager
    async def membership(self) -> AsyncIterator[trio.MemoryReceiveChannel[MembershipEvent]]:
        """``async with node.membership() as events: async for ev in events: ...``"""
        send, receive = trio.open_memory_channel[MembershipEvent](1024)
        self._watchers.append(send)
        try:
            yield receive
        finally:
            self._watchers.remove(send)

    def add_peer(self, peer: Peer) -> bool:
        """A verified peer appeared (discovery or a static seed): it joins the overlay.

        Returns whether ``peer`` told something new.  A record older than the
        one already known, or than the departure last reported, changes nothing.
        """
        now = trio.current_time()
        new, out = self.machine.add_peer(peer, incarnation_of(peer), now)
        link = self._links.get(peer.node_id)
        if new and link is not None:
            link.wake.set()
        self._handle(out, now)
        return new

    def peer_gone(self, node_id: int) -> None:
        """Discovery saw ``node_id``'s service go (an mDNS goodbye): only a hint.

        Anyone on the LAN can send a goodbye for any name, so it never evicts:
        the detector probes the node now, and only unanswered probes make a
        suspicion (a member leaves by its own authenticated LEAVE or by the
        detector's verdict, DESIGN.md §5)."""
        if node_id in self._alive:
            log.info("mDNS goodbye for %016x: probing it (a hint, not an eviction)", node_id)
            self._unreachable(node_id)

    # ------------------------------------------------------------ lifecycle

    def _announce_leave(self) -> None:
        """On a clean close: tell every member believed up that this node leaves,
        behind whatever is queued for it (so they do not suspect it)."""
        self.leaving = True
        if self.detector is None:
            return
        self._timing.cancel()  # a leaving node accuses nobody (its view no longer matters)
        self._handle(self.machine.leave(trio.current_time()))

    async def _leave_unmet_seeds(self) -> None:
        """On a clean close: a seed that learnt this node but whose answer has not
        arrived (``NodeMachine.leave``: :class:`~p2p.machine.LeaveSeed`) gets the
        LEAVE on a connection of its own, within ``drain_timeout``; otherwise
        it would suspect a node that left."""
        unmet, self._unmet_seeds = self._unmet_seeds, []
        if not unmet:
            return
        with trio.move_on_after(self.config.drain_timeout):
            async with trio.open_nursery() as nursery:
                for o in unmet:
                    host, port = parse_address(o.address)
                    nursery.start_soon(self._send_control_once, host, port, o.msg)

    async def _discover(self, discovery: Discovery) -> None:
        async for event in discovery.events():
            if event.kind == "up":
                if self.add_peer(event.peer):
                    self._handle(self.machine.spread([event.peer.record], None))
            else:
                self.peer_gone(event.peer.node_id)

    async def _drain(self) -> None:
        """Give queued packets ``drain_timeout`` to leave; report what stays behind."""
        with trio.move_on_after(self.config.drain_timeout):
            while any(
                link.outbox or (link.log and link.peer_id in self._alive)
                for link in self._links.values()
            ):
                await trio.sleep(0.01)
        left = sum(len(link.outbox) for link in self._links.values())
        if left:
            log.warning("closing with %d packets still queued (dropped)", left)
            self.stats["lost_on_disconnect"] += left

    async def _last_upload(self) -> None:
        """On a clean close: the last telemetry window and a final upload attempt.

        What does not make it within ``drain_timeout`` stays in the spool and
        goes with the next start's first upload.
        """
        if self.recorder is None:
            return
        _close_recorder(self)
        if self.config.telemetry_collector is None:
            return
        from p2p.telemetry._collector import UploadStats, upload_spool

        with trio.move_on_after(self.config.drain_timeout):
            try:
                await upload_spool(
                    self.identity,
                    self.fleet,
                    self.recorder.spool,
                    self.config.telemetry_collector,
                    UploadStats(),
                )
            except (
                OSError,
                P2PError,
                EOFError,
                trio.TooSlowError,
                trio.BrokenResourceError,
            ) as exc:
                log.warning("final telemetry upload failed (kept for the next start): %s", exc)

    def _restore_frontier(self, path: Path) -> None:
        """Take the frontier the node's previous process kept at ``path`` (none
        valid: one log line, and nothing is counted as missed across this
        restart)."""
        store = self._frontier_store = FrontierStore(path)
        try:
            self.machine.restore_frontier(store.load())
        except FrontierFileError as exc:
            log.warning("%s; publications missed before this start are not counted", exc)
        self._frontier_saved = self._frontier_synced = self.machine.frontier.changes

    async def _keep_frontier(self) -> None:
        """Make the frontier's writes durable every ``frontier_interval`` seconds
        (fsync, in a worker thread: it never stalls the event loop)."""
        store = self._frontier_store
        assert store is not None
        while True:
            await trio.sleep(self.config.frontier_interval)
            if self._frontier_synced != self._frontier_saved:
                synced = self._frontier_saved
                try:
                    await trio.to_thread.run_sync(store.sync)
                except OSError as exc:
                    self.quiet.error(("frontier", None), "cannot keep the frontier: %s", exc)
                    continue
                self._frontier_synced = synced

    def _close_frontier(self) -> None:
        """At the close: the last write, made durable."""
        store = self._frontier_store
        if store is None:
            return
        self._write_frontier()
        try:
            store.sync()
        except OSError as exc:
            log.error("cannot keep the frontier: %s", exc)
        store.close()

    def _follow_wall_clock(self) -> None:
        """Renew ``_wall_offset`` (at the recorder's start and every window, so a
        step of the wall clock shows in latencies within one window)."""
        self._wall_offset = time.time() - trio.current_time()

    async def _record(self) -> None:
        """Write a telemetry window every ``telemetry_window`` seconds."""
        assert self.recorder is not None
        while True:
            await trio.sleep(self.config.telemetry_window)
            self._flush_telemetry()

    def _flush_telemetry(self) -> None:
        """Close the current telemetry window; a full disk is logged, never fatal."""
        if self.recorder is None or self.recorder.closed:
            return
        try:
            self.recorder.flush(time.time(), self.stats, self.connections)
        except OSError as exc:
            log.error("telemetry not written: %s", exc)
        self._follow_wall_clock()
        for pending in (self._received_at, self._published_at):
            if len(pending) > self.config.pubsub.max_held:  # never delivered or acked
                pending.clear()


@asynccontextmanager
async def open_node(
    node_dir: str | Path | tuple[NodeIdentity, Fleet],
    config: NodeConfig | None = None,
    *,
    trace: TraceHook | None = None,
) -> AsyncIterator[Node]:
    """Run a node for the duration of the ``async with`` block.

    ``node_dir`` is a directory made by ``p2p fleet add-node`` (or an
    ``(identity, fleet)`` pair).  The node listens on ``config.interface``,
    announces itself by mDNS there, and dials peers as the protocol needs them.
    A directory is locked for the block (:func:`~p2p._identity.lock_identity`):
    a second node of the same identity raises ``IdentityInUseError``.
    """
    if isinstance(node_dir, tuple):
        async with _open_node(node_dir, config or NodeConfig(), trace) as node:
            yield node
        return
    loaded = load_node(node_dir)
    cfg = config or NodeConfig()
    if cfg.revocation_file is None:  # a member follows the list in its directory
        cfg = replace(cfg, revocation_file=Path(node_dir) / REVOKED_FILE)
    if cfg.frontier_file is None:  # and keeps what it delivered there
        cfg = replace(cfg, frontier_file=Path(node_dir) / FRONTIER_FILE)
    with lock_identity(node_dir):
        async with _open_node(loaded, cfg, trace) as node:
            yield node


def _detached(listener: trio.SocketListener) -> socket.socket:
    """The listening socket of ``listener`` as a non-blocking stdlib socket
    (``_Server.accept`` takes a whole backlog in one turn of the loop)."""
    sock = socket.socket(fileno=listener.socket.detach())
    sock.setblocking(False)
    return sock


@asynccontextmanager
async def _open_node(
    loaded: tuple[NodeIdentity, Fleet], cfg: NodeConfig, trace: TraceHook | None
) -> AsyncIterator[Node]:
    identity, fleet = loaded
    quiet_accept_errors()
    node = Node(identity, fleet, cfg, trace)
    follow = cfg.revocation_file
    node._revocation_file = None if follow is None else Path(follow)
    try:  # here, not inside the nursery: a bind error is one clear NodeError, not a group
        opened = await trio.open_tcp_listeners(cfg.port, host=cfg.interface)
    except OSError as exc:  # also socket.gaierror: not an address at all
        raise NodeError(
            f"cannot listen on {cfg.interface} port {cfg.port}: {exc.strerror or exc}"
        ) from exc
    async with trio.open_nursery() as nursery:
        socks = [_detached(listener) for listener in opened]
        node.port = socks[0].getsockname()[1]
        for sock in socks:
            nursery.start_soon(node.accept, sock, nursery)
        node._nursery = nursery
        node.record = node._sign_record()
        node._follow_revocation_file(trio.current_time())
        if cfg.frontier_file is not None:
            node._restore_frontier(Path(cfg.frontier_file))
            nursery.start_soon(node._keep_frontier)
        now = trio.current_time()
        for seed in cfg.seeds:
            if not _names_self(seed, cfg.interface, node.port):
                node.machine.add_seed(seed, now)
        nursery.start_soon(node._timers)
        if cfg.telemetry_dir is not None:
            node.recorder = _open_recorder(node, cfg)
            node._follow_wall_clock()
            nursery.start_soon(node._record)
            if cfg.telemetry_collector is not None:
                from p2p.telemetry._collector import uploader

                nursery.start_soon(
                    partial(
                        uploader,
                        identity,
                        fleet,
                        node.recorder.spool,
                        cfg.telemetry_collector,
                        interval=cfg.telemetry_upload_interval,
                    )
                )
        try:
            async with contextlib.AsyncExitStack() as discovering:  # open while the node runs
                if cfg.discovery:
                    discovery = Discovery(
                        interface=cfg.interface,
                        node_id=node.id,
                        port=node.port,
                        record=node.record,
                        verify=node.verify,
                        service_type=cfg.service_type,
                    )
                    await discovering.enter_async_context(discovery)
                    nursery.start_soon(node._discover, discovery)
                _settle_heap(cfg.gc_young)
                yield node
                node._announce_leave()
                await node._leave_unmet_seeds()
                await node._drain()
                await node._last_upload()
        finally:
            node._closed = True
            nursery.cancel_scope.cancel()
            _close_recorder(node)
            node._close_frontier()


def _names_self(seed: str, interface: str, port: int) -> bool:
    """Whether ``seed`` is this node's own listening address (a fleet started
    with one seed list gives the seed its own address): dialling it would
    only cost a handshake with itself every ``seed_interval``."""
    host, seed_port = parse_address(seed)
    anywhere = interface in ("0.0.0.0", "::", "")
    return seed_port == port and (host == interface or (anywhere and is_loopback(host)))


def _settle_heap(young: int | None) -> None:
    """Once a node is up: collect the garbage start-up left, give the freed memory back
    to the OS (glibc's ``malloc_trim``; elsewhere nothing), move every object
    alive now (the imported modules, the node) out of the cyclic collector's way
    with ``gc.freeze``, so that its full collections no longer walk the tens of
    thousands of objects of the imports (13 ms each on an idle core), and raise
    the young generation's threshold to ``young`` (``NodeConfig.gc_young``).

    Process-wide and harmless: frozen objects are still freed by reference
    counting; only a reference cycle among them would never be collected; the
    threshold is only ever raised, so a setting of the application's that is
    higher stays.
    """
    threshold = gc.get_threshold()
    if young is not None and threshold[0] < young:
        gc.set_threshold(young, *threshold[1:])
    gc.collect()
    if sys.platform == "linux":
        import ctypes  # already loaded by trio

        with contextlib.suppress(OSError, AttributeError):  # AttributeError: not glibc
            ctypes.CDLL(None).malloc_trim(0)
    gc.freeze()


def _open_recorder(node: Node, cfg: NodeConfig) -> Recorder:
    from p2p.telemetry._recorder import Recorder, Spool

    assert cfg.telemetry_dir is not None
    spool = Spool(cfg.telemetry_dir, max_bytes=cfg.telemetry_max_bytes)
    recorder = Recorder(node.id, spool, window=cfg.telemetry_window)
    recorder.event(time.time(), "start", detail=f"port {node.port}")
    return recorder


def _close_recorder(node: Node) -> None:
    """Last window, a ``stop`` event, and the current spool file completed (once)."""
    if node.recorder is None or node.recorder.closed:
        return
    node._flush_telemetry()
    node.recorder.closed = True
    try:
        node.recorder.event(time.time(), "stop")
        node.recorder.spool.close()
    except OSError as exc:
        log.error("telemetry not closed cleanly: %s", exc)


__all__ = [
    "Node",
    "open_node",
]

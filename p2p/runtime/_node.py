"""The trio runtime: one VCube-PS node on real TCP, mDNS and the fleet's secure channel.

The runtime is thin: every protocol decision is the sans-IO core's
(:class:`topics.VCubePS`).  This module moves bytes and keeps four promises:

* **Every connection is authenticated and every frame sealed** (``p2p._secure``);
  each frame body is checked by ``p2p._wire`` before a packet reaches the core.
  A peer that breaks the handshake, a seal, the wire schema or the protocol
  gets a log line naming it and its connection closed; nothing else changes
  (the core rejects a bad packet before changing state).
* **Connections follow need**: a node dials a peer only when the core sends to
  it, i.e. its O(log N) tree neighbours, re-dialling with capped backoff.
  Each direction uses the connection its sender dialled.
* **Link coalescing without timers**: each peer has an outbox; whatever queues
  while the previous frame is being written leaves together in the next frame.
* **Bounded memory**: an outbox holds at most ``outbox_limit`` packets and a
  subscription at most ``delivery_buffer`` deliveries; overflow is counted and
  logged (``Node.stats``), never silent.

Members are found by mDNS on the node's interface and, for networks without
multicast, through *static seeds* (``NodeConfig.seeds``): a node sends its
signed discovery record and the records it knows to each seed and asks for
theirs (peer exchange); a node that learns new records passes them on to its
VCube neighbours, so every member hears of a join in O(log N) hops.  Every
record is verified (fleet membership, signature) before it is used.

Links lose nothing (``p2p._reliable``): each link numbers its frames and
keeps them until the peer confirms them on the same connection; a new
connection sends again what was not confirmed, and the receiver drops what it
already handled.  Only frames meant for a peer that restarted as another
incarnation are lost (counted in ``stats["lost_on_disconnect"]``).

Failures (issue 5): each node runs the VCube failure detector
(``vcube.Detector``) over its members, its probes and replies riding the
fleet connections as control packets, and every received frame counting as a
sign of life.  A suspected or departed node leaves the overlay, its link is
dropped and the core repairs around it (``VCubePS.crashed``); a node that
joins or restarts (a higher incarnation, ``p2p.runtime._liveness``) is announced to
the core (``VCubePS.joined``).  A node closing cleanly announces its leave.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import secrets
import struct
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from causal import MsgId
from p2p._errors import IdentityError, IdentityInUseError, NodeError, P2PError, SecurityError
from p2p._identity import Fleet, NodeIdentity, load_node, lock_identity
from p2p._membership import Peer, records_digest
from p2p._reliable import ACK_EVERY, Hello, ReceiveLog, SendLog, decode_ack, encode_ack
from p2p._revocation import REVOKED_FILE, RevocationList, load_revocations
from p2p._secure import MAX_PLAINTEXT, SecureSession, sign_record
from p2p._transport import (
    Messages,
    Quiet,
    accept_secure,
    dial_secure,
    fd_budget,
    is_loopback,
    parse_address,
    quiet_accept_errors,
    remote_host,
    verified_peer,
)
from p2p._wire import (
    Control,
    FrameReader,
    Leave,
    Members,
    PeerExchange,
    Revoked,
    WireError,
    WireLimits,
    decode_body,
    encode_packets,
    frame,
    uint_size,
)
from p2p.machine import (
    MemberDown,
    MemberUp,
    NodeMachine,
    Reincarnated,
    RoundStarted,
    SendControl,
    SendExchange,
    Stalled,
    Superseded,
    SuspicionCorrected,
)
from p2p.runtime._discovery import SERVICE_TYPE, Discovery
from p2p.runtime._liveness import (
    INC_FIELD,
    detector_config,
    new_incarnation,
    next_incarnation,
    record_incarnation,
)
from topics import (
    Bundle,
    Delivered,
    Dropped,
    Output,
    Packet,
    Published,
    PubSubConfig,
    Received,
    RemoteProtocolError,
    RoundAcked,
    Send,
    Subscribed,
    VCubePS,
)
from vcube import Detector, DetectorError, Hypercube, RemoteDetectorError

if TYPE_CHECKING:  # imported when a node records telemetry (NodeConfig.telemetry_dir)
    from p2p.telemetry._recorder import Recorder

log = logging.getLogger("p2p.node")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """Runtime settings; every limit on outside input has a default."""

    interface: str = "127.0.0.1"
    port: int = 0
    discovery: bool = True
    service_type: str = SERVICE_TYPE
    pubsub: PubSubConfig = field(default_factory=PubSubConfig)
    max_frame: int = MAX_PLAINTEXT
    outbox_limit: int = 100_000
    """Most packets queued for one peer; beyond it packets are dropped and counted."""
    overflow: str = "drop"
    """Policy for a slow peer: ``drop`` (the outbox limit drops and counts) or
    ``backpressure`` (``publish`` also waits while any outbox is over half full,
    so a local publisher slows down instead of losing; relayed traffic can
    still only be dropped at the limit)."""
    delivery_buffer: int = 10_000
    max_connections: int = 1024
    """Most TCP connections open at once (both directions); more are refused."""
    max_handshakes: int = 64
    """Most unauthenticated connections (handshakes under way) at once."""
    max_handshakes_per_host: int = 8
    """Most handshakes under way from one source address (loopback excepted: a
    host's own nodes); a LAN outsider cannot take every slot."""
    unconfirmed_limit: int = 4096
    """Most frames a link keeps until its peer confirms them (sent again after a
    reconnection, ``p2p._reliable``); beyond it the oldest are counted as lost."""
    handshake_timeout: float = 10.0
    drain_timeout: float = 2.0
    max_backoff: float = 5.0
    seeds: tuple[str, ...] = ()
    """``host:port`` of members to exchange peers with (networks without multicast)."""
    seed_interval: float = 30.0
    """Seconds between peer exchanges with each seed (after the first succeeds)."""
    telemetry_dir: str | Path | None = None
    """Spool telemetry records here (``p2p.telemetry``); ``None``: record nothing."""
    telemetry_window: float = 10.0
    """Seconds per telemetry window (one node record, one record per active topic)."""
    telemetry_max_bytes: int = 64 << 20
    """Disk cap of the telemetry spool; the oldest files go first (and are counted)."""
    telemetry_collector: str | None = None
    """``host:port`` of a telemetry collector to upload the spool to (needs ``telemetry_dir``)."""
    telemetry_upload_interval: float = 30.0
    """Seconds between uploads to the collector."""
    revocation_file: str | Path | None = None
    """The fleet's revocation list to follow (read at start and whenever it
    changes; ``p2p fleet revoke --to``); ``open_node(NODE_DIR)`` follows
    ``NODE_DIR/revoked.cbor`` when this is ``None``."""
    detector: bool = True
    """Run the failure detector (``False``: a crashed peer is never noticed and
    the rounds that wait for it stall, the behaviour before issue 5)."""
    detector_interval: float = 1.0
    """Seconds between the detector's testing rounds."""
    detector_timeout: float | None = None
    """Age at which an unanswered probe counts as missed (``None``: the
    interval; probes expire at this deadline, not at the next round)."""
    detector_attempts: int = 2
    """Probes in a row that must go unanswered before a suspicion (2: one
    delayed probe or reply on a busy host is not a false suspicion)."""
    detector_stretch: float = 8.0
    """How far a probe's timeout may stretch on a loaded host: up to this many
    times ``detector_timeout``, following measured round trips and evidence
    of false suspicions (Lifeguard's local health; ``vcube._timing``).  1
    keeps every timeout fixed."""

    def __post_init__(self) -> None:
        if self.overflow not in ("drop", "backpressure"):
            raise NodeError(f"overflow must be 'drop' or 'backpressure', got {self.overflow!r}")
        if self.interface in ("", "0.0.0.0", "::"):
            raise NodeError(
                f"interface {self.interface!r}: give the address peers should dial (e.g. 127.0.0.1)"
            )
        for seed in self.seeds:
            parse_address(seed)
        if self.telemetry_collector is not None:
            parse_address(self.telemetry_collector)
            if self.telemetry_dir is None:
                raise NodeError("telemetry_collector needs telemetry_dir (the spool to upload)")
        if not 0 <= self.port < 65536:
            raise NodeError(f"port must be in 0..65535, got {self.port}")
        positive = (
            "max_connections",
            "max_handshakes",
            "max_handshakes_per_host",
            "outbox_limit",
            "unconfirmed_limit",
            "delivery_buffer",
            "handshake_timeout",
            "seed_interval",
            "telemetry_window",
            "telemetry_max_bytes",
            "telemetry_upload_interval",
        )
        for name in (*positive, "drain_timeout", "max_backoff"):
            value = getattr(self, name)
            if value < 0 or (name in positive and value == 0):
                raise NodeError(f"{name} must be positive, got {value}")
        if not self.detector_stretch >= 1:  # also refuses NaN
            raise NodeError(f"detector_stretch must be >= 1, got {self.detector_stretch}")
        try:
            detector_config(
                self.detector_interval,
                self.detector_timeout,
                self.detector_attempts,
                self.detector_stretch,
            )
        except DetectorError as exc:
            raise NodeError(f"detector settings: {exc}") from None
        timeout = self.detector_timeout
        if timeout is not None and timeout > self.detector_interval:
            raise NodeError("detector_timeout must not exceed detector_interval")


@dataclass(frozen=True, slots=True)
class Delivery:
    """A publication handed to the application, in causal order per topic.

    ``published_at`` is the publisher's wall clock (Unix seconds) when it
    published: comparable across hosts only as far as their clocks agree.
    """

    topic: str
    source: int
    incarnation: int
    seq: int
    payload: bytes
    own: bool
    published_at: float = 0.0


_STAMP = struct.Struct(">d")
"""The runtime's payload envelope: the publish wall clock, then the application's bytes."""
_STAMP_SIZE = _STAMP.size
_unpack_stamp = _STAMP.unpack_from


def _delivery_maker() -> Callable[[str, int, int, int, bytes, bool, float], Delivery]:
    """A constructor of :class:`Delivery` that fills its slots directly, without the
    frozen dataclass' ``__init__`` (seven ``object.__setattr__`` calls per delivery);
    the class itself if its fields are not the ones this code knows."""
    names = ("topic", "source", "incarnation", "seq", "payload", "own", "published_at")
    if not tuple(f.name for f in fields(Delivery)) == names == Delivery.__slots__:
        return Delivery
    s_topic, s_source, s_inc, s_seq, s_payload, s_own, s_at = (
        Delivery.__dict__[n].__set__ for n in names
    )
    new = object.__new__

    def make(
        topic: str, source: int, inc: int, seq: int, payload: bytes, own: bool, at: float
    ) -> Delivery:
        d: Delivery = new(Delivery)
        s_topic(d, topic)
        s_source(d, source)
        s_inc(d, inc)
        s_seq(d, seq)
        s_payload(d, payload)
        s_own(d, own)
        s_at(d, at)
        return d

    return make


_new_delivery = _delivery_maker()


@dataclass(frozen=True, slots=True)
class MembershipEvent:
    """``kind`` is ``joined`` or ``left`` (the overlay gained or lost ``node``).

    ``reason`` says why: ``discovered`` (a new member), ``restarted`` (a new
    ``incarnation`` of a known id), ``suspected`` (the failure detector
    suspects it: treated as crashed), ``left`` (it announced a graceful
    leave, or discovery reported its departure).
    """

    kind: str
    node: int
    incarnation: int = 0
    reason: str = ""


class Subscription:
    """Async iterator of :class:`Delivery` for one topic.

    Deliveries wait in a queue of at most ``NodeConfig.delivery_buffer``.
    Reading is cheap when some are queued: :meth:`receive` is a cancellation
    point every time but lets other tasks run (a schedule point) only every
    :data:`DELIVERY_BATCH` deliveries, or when it has to wait; a received
    round of publications thus costs one wake-up, not one per delivery.
    """

    def __init__(self, topic: str, capacity: int) -> None:
        self.topic = topic
        self.dropped = 0
        """Deliveries lost because the application did not read fast enough."""
        self._queue: deque[Delivery] = deque()
        self._capacity = capacity
        self._closed = False
        self._waiting = trio.lowlevel.ParkingLot()
        self._parked = False
        """Whether a reader may be parked in ``_waiting``: set before parking, cleared
        only by waking them all (cheaper to test per delivery than the lot itself)."""
        self._streak = 0

    def _put(self, item: Delivery) -> bool:
        """Queue ``item`` (no checkpoint); ``False`` if the queue is full.

        :meth:`Node._deliver` does the same inline (the hot path)."""
        if len(self._queue) >= self._capacity:
            return False
        self._queue.append(item)
        if self._parked:
            self._parked = False
            self._waiting.unpark_all()
        return True

    def _close(self) -> None:
        """No more deliveries: readers get what is queued, then the end."""
        self._closed = True
        self._waiting.unpark_all()

    def __aiter__(self) -> AsyncIterator[Delivery]:
        return self

    async def __anext__(self) -> Delivery:
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._queue and self._streak < DELIVERY_BATCH - 1:  # receive()'s usual case
            self._streak += 1
            return self._queue.popleft()
        try:
            return await self._next()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    async def receive(self) -> Delivery:
        """The next delivery; ``trio.EndOfChannel`` once unsubscribed and all read."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._queue and self._streak < DELIVERY_BATCH - 1:
            self._streak += 1
            return self._queue.popleft()
        return await self._next()

    async def _next(self) -> Delivery:
        """:meth:`receive` after its cancellation point, when it has to yield or wait."""
        queue = self._queue
        if queue:  # the batch is over: let others run
            await trio.lowlevel.cancel_shielded_checkpoint()
        while not queue:
            if self._closed:
                raise trio.EndOfChannel
            self._parked = True
            await self._waiting.park()
        self._streak = 0
        return queue.popleft()


DELIVERY_BATCH = 64
"""Deliveries :meth:`Subscription.receive` hands out between two schedule points."""

PUBLISH_BATCH = 32
"""Publications :meth:`Node.publish` and :meth:`Node.publish_many` accept between
two schedule points (and the most ``publish_many`` dispatches at once).  Without
them a publisher looping flat out holds the trio loop for as long as its loop
runs (up to a whole queue of rounds), while the round its last ACK wave
released waits for the link writers."""


def _published_id(out: list[Output]) -> MsgId:
    """The id in the :class:`~topics.Published` among a publication's outputs."""
    first = out[0] if out else None
    if type(first) is Published:  # where the core puts it
        return first.id
    return next(o.id for o in out if isinstance(o, Published))


TraceHook = Callable[[str, str, int | None, int | None, int], None]
"""``(event, topic, source, seq, incarnation)`` for the trace writer of ``p2p node``.

``incarnation`` is the source's for ``publish`` and ``deliver`` (a publication
is ``(source, incarnation, seq)``: a restarted process numbers from 0 again) and
the node's own for membership events."""


_Item = Packet | PeerExchange | Control
"""What an outbox holds: core packets, control packets (detector messages, a
leave), and now and then a peer exchange."""

EXCHANGE_CHUNK = 256
"""Records per peer-exchange item (well under ``WireLimits.max_records``)."""


class _Link:
    """The outbox and writer of one peer (sending direction only)."""

    def __init__(self, node: Node, peer_id: int) -> None:
        self.node = node
        self.peer_id = peer_id
        self.outbox: deque[_Item] = deque()
        self.wake = trio.Event()
        self.scope = trio.CancelScope()
        """Cancelled when the peer is suspected or leaves (:meth:`Node._drop_link`)."""
        self.control_bytes = 0
        """Bytes of control packets in the frame :meth:`_take` returned last."""
        self.alive_bytes = 0
        """Bytes of its piggybacked detector version (*alive*, ``p2p._wire``)."""
        self.log = SendLog(secrets.randbits(63) | 1, limit=node.config.unconfirmed_limit)
        """Frames sent and not yet confirmed by the peer (``p2p._reliable``)."""
        self.confirmed = False
        """Whether the peer confirmed a frame on the current connection (it works)."""
        self.connection: trio.CancelScope | None = None
        """The current connection's scope (:meth:`redial` closes it)."""
        self.dialled: Peer | None = None
        """The record the current connection was dialled from."""

    def put_control(self, item: Control) -> None:
        """Queue a control packet; a full outbox drops it (counted), like a packet."""
        if len(self.outbox) >= self.node.config.outbox_limit:
            self.node.stats["control_dropped"] += 1
            return
        self.outbox.append(item)
        self.wake.set()

    def redial(self, life: int) -> Peer | None:
        """The peer runs as ``life`` now: a connection to another life of it is
        closed, so the next frames go to the newest record's address.  Else a
        process superseded by a newer start of the same identity would take,
        and confirm, frames meant for the new one.  Returns the record that
        connection was dialled from (``None``: no such connection)."""
        if self.connection is None or self.log.peer_life in (None, life):
            return None
        self.connection.cancel()
        # Now, not at the next dial: frames logged from here on are the new
        # life's (a doomed connection may still take some) and are sent again.
        self._to_life(life)
        return self.dialled

    def _to_life(self, life: int) -> None:
        """Frames logged for another life of the peer are lost with it (counted)."""
        forgotten = self.log.reconnected(life)
        if forgotten:
            self.node.stats["lost_on_disconnect"] += forgotten
            log.warning("%016x restarted: %d packets to its old life lost", self.peer_id, forgotten)

    def core_packets(self) -> int:
        """Core packets queued (what the peer loses if the link is dropped now)."""
        return sum(1 for x in self.outbox if not isinstance(x, _NOT_CORE))

    def put_exchange(self, records: list[bytes], *, reply: bool) -> None:
        """Queue ``records`` for the peer, in chunks; only the last chunk asks for a reply."""
        chunks = [records[i : i + EXCHANGE_CHUNK] for i in range(0, len(records), EXCHANGE_CHUNK)]
        for i, chunk in enumerate(chunks):
            self.outbox.append(PeerExchange(tuple(chunk), reply and i == len(chunks) - 1))
        self.wake.set()

    def put(self, packets: list[Packet]) -> None:
        """Queue ``packets``; beyond the limit they are counted and logged, not kept."""
        room = self.node.config.outbox_limit - len(self.outbox)
        if len(packets) > room:
            lost = len(packets) - max(room, 0)
            self.node.stats["outbox_overflow"] += lost
            log.error("outbox to %016x full: %d packets not queued", self.peer_id, lost)
            packets = packets[: max(room, 0)]
        self.outbox.extend(packets)
        self.wake.set()

    async def run(self) -> None:
        """Dial when there is something to send; write frames; re-dial with backoff.

        Ends when :attr:`scope` is cancelled (the peer was dropped)."""
        with self.scope:
            await self._run()

    async def _run(self) -> None:
        backoff = 0.05
        # lost: a connection broke and was not re-established since: re-dial at
        # once, and if that fails, hint the detector (Node._unreachable).
        lost = False
        while True:
            if not lost:
                await self._wait_for_work()
            peer = self.node.peers.get(self.peer_id)
            if peer is None:  # no address yet: discovery will call wake
                self.wake = trio.Event()
                await self.wake.wait()
                continue
            try:
                stream, session = await self.node.dial(peer)
            except (
                OSError,
                EOFError,
                SecurityError,
                WireError,
                trio.TooSlowError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
            ) as exc:
                self.node.quiet.warn(
                    ("unreachable", peer.node_id),
                    "cannot reach %016x at %s:%d: %s",
                    peer.node_id,
                    peer.host,
                    peer.port,
                    _why(exc),
                )
                if lost and not isinstance(exc, SecurityError | WireError):
                    self.node._unreachable(self.peer_id)  # one hint per lost connection
                lost = False
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self.node.config.max_backoff)
                continue
            if self.node.record:  # introduce this node: the peer may not know its address
                self.outbox.appendleft(PeerExchange((self.node.record,)))
            self._to_life(_incarnation_of(peer))
            opened = trio.current_time()
            self.confirmed = False
            self.node.connections += 1
            try:
                with trio.CancelScope() as self.connection:
                    self.dialled = peer
                    await self._pump_until_closed(stream, session)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.node.quiet.warn(
                    ("lost", self.peer_id), "connection to %016x lost: %s", self.peer_id, exc
                )
            finally:
                self.connection = None
                self.node.connections -= 1
                with trio.CancelScope(shield=True):
                    await stream.aclose()
            lost = True
            if self.confirmed or trio.current_time() - opened >= _LASTED:
                backoff = 0.05  # a working peer on a flaky network: reconnect at once
            else:  # closed as soon as opened: back off as after a failed dial, no tight loop
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self.node.config.max_backoff)

    async def _pump_until_closed(self, stream: trio.SocketStream, session: SecureSession) -> None:
        """Send the hello and what the peer has not confirmed, then :meth:`_pump`
        until a write fails or the peer closes the connection.

        The peer writes only acks on a connection this node dialled, so the
        ack reader also learns at once when the connection ends (a crashed
        process's kernel closes it): the link knows without waiting to write.
        """
        error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_acks, stream, session, nursery.cancel_scope)
            try:
                await self._resume(stream, session)
                await self._pump(stream, session)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                error = exc  # re-raised outside the nursery, not in an exception group
            nursery.cancel_scope.cancel()
        if error is not None:
            raise error

    async def _resume(self, stream: trio.SocketStream, session: SecureSession) -> None:
        """Open the connection with the link's hello, then every frame the peer
        has not confirmed, oldest first (it drops those it already handled)."""
        again = self.log.unconfirmed()
        records = [self.log.hello().encode(), *(body for body, _ in again)]
        await stream.send_all(b"".join(frame(session.seal(r)) for r in records))
        if again:
            self.node.stats["frames_resent"] += len(again)
            self.node.stats["packets_resent"] += sum(n for _, n in again)

    async def _read_acks(
        self, stream: trio.SocketStream, session: SecureSession, scope: trio.CancelScope
    ) -> None:
        """Read the peer's acks until the connection ends, then cancel ``scope``;
        a malformed ack ends the connection too (the log keeps every frame)."""
        reader = FrameReader(WireLimits(max_frame=64))
        try:
            while data := await stream.receive_some(4096):
                for record in reader.feed(data):
                    self.log.acked(decode_ack(session.open(record)))
                    self.confirmed = True
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except (WireError, SecurityError) as exc:
            log.warning("bad link ack from %016x: %s", self.peer_id, exc)
        scope.cancel()

    async def _wait_for_work(self) -> None:
        while not self.outbox:
            self.wake = trio.Event()
            await self.wake.wait()

    async def _pump(self, stream: trio.SocketStream, session: SecureSession) -> None:
        """Write everything queued, one frame per batch that fits ``max_frame``."""
        while True:
            await self._wait_for_work()
            taken = self._take()
            if taken is None:
                continue
            count, body = taken
            control = self.control_bytes
            lost = self.log.sent(body, count)  # kept until confirmed: a failed write loses nothing
            if lost:
                self.node.stats["lost_on_disconnect"] += lost
                log.error(
                    "%016x confirms nothing: %d unconfirmed packets forgotten", self.peer_id, lost
                )
            data = frame(session.seal(body))
            await stream.send_all(data)
            self.node.stats["frames_sent"] += 1
            self.node.stats["packets_sent"] += count
            self.node._room.set()
            self.node.stats["bytes_sent"] += len(data)
            if control and not count:  # a frame of control packets only costs its whole size
                self.node.stats["detector_bytes_sent"] += len(data)
            else:
                self.node.stats["detector_bytes_sent"] += control + self.alive_bytes

    def _take(self) -> tuple[int, bytes] | None:
        """A prefix of the outbox as one frame body, and the core packets in it
        (:attr:`control_bytes`: the bytes of its control packets, 0 if none).

        Usually everything queued fits and is encoded once; a batch that is too
        big is halved until it fits.  A single packet too big for any frame is
        dropped, counted and logged.  A frame carries at most one exchange.
        """
        limit = self.node.config.max_frame - 64  # room for the seal's counter and tag
        count = self._batch_len()
        while count:
            batch = [self.outbox[i] for i in range(count)]
            packets = [x for x in batch if not isinstance(x, _NOT_CORE)]
            exchange = next((x for x in batch if isinstance(x, PeerExchange)), None)
            control = [x for x in batch if isinstance(x, _CONTROL)]
            det = self.node.detector
            alive = None if det is None else det.version  # as late as possible: the freshest
            body = encode_packets(packets, exchange, control, alive)  # type: ignore[arg-type]
            if len(body) <= limit:
                for _ in range(count):
                    self.outbox.popleft()
                self.control_bytes = len(encode_packets([], None, control)) - 3 if control else 0
                self.alive_bytes = 0 if alive is None else uint_size(alive)
                return len(packets), body
            if count == 1:
                self.outbox.popleft()
                self.node.stats["oversize_dropped"] += 1
                log.error("packet of %d bytes exceeds max_frame; dropped", len(body))
                return None
            count //= 2
        return None

    def _batch_len(self) -> int:
        """Length of the longest outbox prefix with at most one exchange."""
        seen = False
        for i, item in enumerate(self.outbox):
            if isinstance(item, PeerExchange):
                if seen:
                    return i
                seen = True
        return len(self.outbox)


_CONTROL = (*Control.__args__,)
_NOT_CORE = (PeerExchange, *_CONTROL)
_RECORD_OVERHEAD = 4 + 8 + 16
"""Bytes a frame adds to its plaintext: length prefix, seal counter, AEAD tag."""
_LASTED = 1.0
"""Seconds a connection must have lasted for its loss to reset a link's backoff."""


class Node:
    """One VCube-PS node on the network.  Create it with :func:`open_node`.

    Membership invariant (kept by :meth:`_up` and :meth:`_down`): the core's
    overlay is ``_alive`` plus this node, and a peer is in ``_alive`` exactly
    when its newest known incarnation (``_incs``) is above the newest one
    handed to ``core.crashed`` (``_dead``).  So the core never routes a SUB
    round through a node it treats as crashed, and a crashed incarnation comes
    back only as a newer one.
    """

    def __init__(
        self,
        identity: NodeIdentity,
        fleet: Fleet,
        config: NodeConfig,
        trace: TraceHook | None = None,
    ) -> None:
        self.identity = identity
        self.fleet = fleet
        self.config = config
        self.id = identity.node_id
        self.port = 0
        # The core and the wire carry the payload behind its 8-byte stamp (_STAMP),
        # so they allow max_payload + 8 and the application gets max_payload exactly.
        stamped = replace(config.pubsub, max_payload=config.pubsub.max_payload + _STAMP_SIZE)

        def make_core(incarnation: int) -> VCubePS:
            return VCubePS(
                self.id, overlay=Hypercube([self.id]), config=stamped, incarnation=incarnation
            )

        dcfg = None
        if config.detector:
            dcfg = detector_config(
                config.detector_interval,
                config.detector_timeout,
                config.detector_attempts,
                config.detector_stretch,
            )

        def verify(record: bytes) -> tuple[Peer, int]:
            peer = self.verify(record)
            return peer, _incarnation_of(peer)

        self.machine = NodeMachine(
            self.id,
            new_incarnation(),
            make_core,
            detector=dcfg,
            incarnations=next_incarnation,
            verify=verify,
        )
        """Membership, the failure detector and the core, sans-IO (``p2p.machine``):
        this class carries out its outputs and feeds it frames, hints and timers."""
        self._alive = self.machine.alive
        """The machine's own tables, read on hot paths (never assigned here)."""
        self._incs = self.machine.incs
        self._dead = self.machine.dead
        self._heard = self.machine.heard
        self._seeded: dict[int, tuple[str, int]] = {}
        """Seeds that received this node's records, by id: one whose own record has
        not arrived yet still hears this node's LEAVE (:meth:`_leave_unmet_seeds`)."""
        self.quiet = Quiet(log)
        """Expected network failures: one warning per cause and peer per 10 s."""
        self._handshakes: dict[int, tuple[str, trio.CancelScope]] = {}
        """Handshakes under way, oldest first: source address and what cancels it
        (admission caps and eviction, :meth:`_make_room`)."""
        self._tickets = 0
        self._max_connections = min(config.max_connections, fd_budget())
        self._received = ReceiveLog()
        self._revoked = self.machine.revoked
        """Node ids the fleet revoked: refused at the handshake, in exchanges, on open links."""
        self._revocations: RevocationList | None = None
        self._revocation_file: Path | None = None
        self._revocation_seen: tuple[int, int] | None = None
        """Per peer, the link and highest frame handled (duplicates after a reconnection)."""
        self._detector_wake: trio.CancelScope | None = None
        """The detector loop's sleep (:meth:`_detect`): moved earlier by a hint's probe."""
        self._detecting = trio.CancelScope()
        """The detector loop; cancelled when the node starts leaving."""
        self.peers = self.machine.peers
        """The newest verified record of each peer (the machine's table)."""
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "frames_sent",
                "packets_sent",
                "frames_received",
                "packets_received",
                "rejected_connections",
                "outbox_overflow",
                "oversize_dropped",
                "lost_on_disconnect",
                "undeliverable",
                "records_learned",
                "bytes_sent",
                "bytes_received",
                "malformed_payload",
                "control_dropped",
                "sent_to_crashed",
                "lost_to_crash",
                "detector_bytes_sent",
                "suspicions",
                "corrections",
                "reincarnations",
                "loop_stalls",
                "frames_resent",
                "packets_resent",
                "frames_duplicate",
                "refused_connections",
            ),
            0,
        )
        self._trace = trace
        self._links: dict[int, _Link] = {}
        self._subs: dict[str, Subscription] = {}
        self._subscribed: dict[str, trio.Event] = {}
        self._acked: dict[MsgId, trio.Event] = {}
        self.acked_views: dict[MsgId, frozenset[int]] = {}
        """For ``publish(wait_acked=True)``: the topic's subscribers as the ACK wave
        completed (taken at that instant, before anything later in the same frame,
        such as a subscriber's leave).  The caller pops its entry."""
        self._watchers: list[trio.MemorySendChannel[MembershipEvent]] = []
        self._nursery: trio.Nursery | None = None
        self._closed = False
        self._limits = WireLimits.from_config(stamped, max_frame=config.max_frame)
        self._room = trio.Event()
        self.recorder: Recorder | None = None
        """Telemetry (``NodeConfig.telemetry_dir``), set by :func:`open_node`."""
        self.connections = 0
        """Open TCP connections (both directions)."""
        self._published_at: dict[MsgId, float] = {}
        self._received_at: dict[MsgId, float] = {}
        """Arrival time of each publication the causal buffer holds back (recording)."""
        self._arrived: MsgId | None = None
        """The last publication received in this batch, not yet delivered nor in
        ``_received_at``: most are delivered next, with no dict write at all."""
        self._streak = 0
        """Publications accepted since the last schedule point of :meth:`publish` or
        :meth:`publish_many` (one every :data:`PUBLISH_BATCH`)."""
        self._now = 0.0
        """The current batch's clock (:meth:`_handle`, when recording)."""
        self._wall_offset = 0.0
        """Wall clock minus trio's clock, set with the recorder and renewed each
        telemetry window (:meth:`_flush_telemetry`): latency from
        a publication's wall-clock stamp without a ``time.time()`` per delivery."""

    def __repr__(self) -> str:
        return f"Node({self.id:016x}, port={self.port}, members={len(self.peers) + 1})"

    @property
    def core(self) -> VCubePS:
        """The VCube-PS core of this node's current incarnation."""
        return self.machine.core

    @property
    def incarnation(self) -> int:
        """This process's incarnation (``p2p.runtime._liveness``), signed into its record."""
        return self.machine.incarnation

    @property
    def detector(self) -> Detector | None:
        """The failure detector (``NodeConfig.detector``)."""
        return self.machine.detector

    # ------------------------------------------------------------ public API

    def members(self) -> frozenset[int]:
        """The overlay members this node knows and believes up (itself included)."""
        return frozenset(self._alive) | {self.id}

    async def subscribe(self, topic: str) -> Subscription:
        """Join ``topic``; returns once the subscription's ACK wave has come back."""
        self._check_open()
        done = trio.Event()
        out = self.machine.subscribe(topic, trio.current_time())  # raises on misuse
        sub = Subscription(topic, self.config.delivery_buffer)
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
        for payload in items:
            self._check_payload(payload)
        if self.config.overflow == "backpressure":
            await self._wait_for_room()
        ids: list[MsgId] = []
        for start in range(0, len(items), PUBLISH_BATCH):
            self._check_open()
            now = trio.current_time()
            stamp = _STAMP.pack(time.time())
            out: list[Output] = []
            try:
                for payload in items[start : start + PUBLISH_BATCH]:
                    more = self.machine.publish(topic, stamp + payload, now)
                    ids.append(_published_id(more))
                    out += more
            finally:  # what was accepted before an error is carried out all the same
                self._handle(out, now)
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
        new, out = self.machine.add_peer(peer, _incarnation_of(peer), now)
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

    # -------------------------------------------------------------- plumbing

    def _check_open(self) -> None:
        if self._closed or self._nursery is None:
            raise NodeError("the node is closed (use it inside `async with open_node(...)`)")

    def _drop_link(self, node: int) -> None:
        """Stop dialling ``node``; what its outbox held is counted as lost."""
        link = self._links.pop(node, None)
        if link is not None:
            self.stats["lost_to_crash"] += link.core_packets()
            link.log.discard()
            link.scope.cancel()

    def _membership_changed(self, event: MembershipEvent) -> None:
        log.info(
            "%s %016x (%s; %d members)", event.kind, event.node, event.reason, len(self._alive) + 1
        )
        for w in list(self._watchers):
            try:
                w.send_nowait(event)
            except trio.WouldBlock:
                log.error("membership watcher too slow: dropped %s", event)

    def _handle(self, outputs: list[Output], now: float | None = None) -> None:
        """Carry out a core's outputs (synchronously: the core stays single-threaded).

        Dispatched on the exact type, the per-publication outputs first (a
        received round yields two per publication); anything else, a subclass
        included, goes through :meth:`_handle_other`.
        """
        recording = self.recorder is not None
        if recording:  # one clock read per batch (``now``, if the caller has one)
            self._now = trio.current_time() if now is None else now
        for o in outputs:
            if type(o) is Delivered:
                self._deliver(o)
            elif type(o) is Received:
                if recording and not o.relay:  # _on_received, inlined: hot path
                    if self._arrived is not None:
                        self._received_at[self._arrived] = self._now
                    self._arrived = o.id
            elif type(o) is Published:
                self._on_published(o)
            elif type(o) is Send:
                self._send(o)
            else:
                self._handle_other(o)
        if self._arrived is not None:  # held back past its batch: timed from now
            self._received_at[self._arrived] = self._now
            self._arrived = None

    def _on_received(self, mid: MsgId) -> None:
        """Note ``mid``'s arrival; the previous one, still undelivered, is held back."""
        if self._arrived is not None:
            self._received_at[self._arrived] = self._now
        self._arrived = mid

    def _handle_other(self, o: Output) -> None:
        if isinstance(o, Send):
            self._send(o)
        elif isinstance(o, Delivered):
            self._deliver(o)
        elif isinstance(o, Subscribed):
            self._trace_event("subscribed", o.topic, None, None)
            ev = self._subscribed.pop(o.topic, None)
            if ev is not None:
                ev.set()
        elif isinstance(o, RoundAcked):
            self._on_acked(o)
        elif isinstance(o, Received):
            if self.recorder is not None and not o.relay:
                self._on_received(o.id)
        elif isinstance(o, Published):
            self._on_published(o)
        elif isinstance(o, Dropped):
            log.warning("%d publications on %r dropped: %s", o.count, o.topic, o.reason)
        else:
            self._on_machine(o)

    def _on_machine(self, o: object) -> None:
        """Carry out one of the machine's membership outputs (``p2p.machine``)."""
        if isinstance(o, SendControl):
            self._link(o.dest).put_control(o.msg)
        elif isinstance(o, SendExchange):
            self._link(o.dest).put_exchange(list(o.records), reply=o.reply)
        elif isinstance(o, MemberUp):
            self._new_life(o.node, o.incarnation)
            self._membership_changed(MembershipEvent("joined", o.node, o.incarnation, o.reason))
        elif isinstance(o, MemberDown):
            self._member_down(o)
        elif isinstance(o, SuspicionCorrected):
            self.stats["corrections"] += 1
            log.info("%016x answers again; waiting for its new incarnation", o.node)
        elif isinstance(o, RoundStarted):
            self._follow_revocation_file(trio.current_time())
        elif isinstance(o, Reincarnated):
            self._reincarnated(o)
        elif isinstance(o, Stalled):
            self._stalled(o)
        elif isinstance(o, Superseded):
            self._superseded(o)

    def _member_down(self, o: MemberDown) -> None:
        """``o.node`` up to ``o.incarnation`` is over: forget its records' sync
        state and frame numbers; if it left the view, drop its link and tell."""
        if o.reason == "suspected":
            self.stats["suspicions"] += 1
            log.warning("suspect %016x (incarnation %d)", o.node, o.incarnation)
        self._received.forget(o.node)
        if o.was_up:
            self._drop_link(o.node)
            self._membership_changed(MembershipEvent("left", o.node, o.incarnation, o.reason))

    def _send(self, o: Send) -> None:
        packets = list(o.packet.packets) if isinstance(o.packet, Bundle) else [o.packet]
        dest = o.dest
        if dest not in self._alive and dest in self._dead:  # the core repairs around it
            self.stats["sent_to_crashed"] += len(packets)
            return
        self._link(dest).put(packets)

    def _on_published(self, o: Published) -> None:
        if self._trace is not None:
            self._trace("publish", o.topic, o.id.source, o.id.seq, o.id.incarnation)
        if self.recorder is not None:
            self.recorder.published(o.topic)
            self._published_at[o.id] = self._now

    def _on_acked(self, o: RoundAcked) -> None:
        if self._acked:  # somebody waits for the ACK wave
            for mid in o.ids:
                acked = self._acked.pop(mid, None)
                if acked is not None:
                    self.acked_views[mid] = self.core.view(o.topic)
                    if len(self.acked_views) > 1024:  # callers that never look: bounded
                        del self.acked_views[next(iter(self.acked_views))]
                    acked.set()
        if self._published_at and self.recorder is not None:
            pop = self._published_at.pop
            self.recorder.acked_since(o.topic, self._now, [pop(mid, None) for mid in o.ids])

    def _deliver(self, d: Delivered) -> None:
        source, incarnation, seq = mid = d.id
        if self._trace is not None:
            self._trace("deliver", d.topic, source, seq, incarnation)
        payload = d.payload
        if len(payload) < _STAMP_SIZE:  # no honest member sends this
            self.stats["malformed_payload"] += 1
            log.error("publication %r on %r has no envelope: not delivered", mid, d.topic)
            return
        (stamp,) = _unpack_stamp(payload)
        if self.recorder is not None and not d.own:
            now = self._now
            if mid == self._arrived:  # delivered in the batch it arrived in
                self._arrived = None
                held = 0.0
            else:
                got = self._received_at.pop(mid, None)
                held = 0.0 if got is None else (now - got) * 1000
            self.recorder.delivered(d.topic, (now + self._wall_offset - stamp) * 1000, held)
        sub = self._subs.get(d.topic)
        if sub is None:
            return
        queue = sub._queue  # Subscription._put, inlined: once per delivery
        if len(queue) >= sub._capacity:
            sub.dropped += 1
            log.error("subscription %r is not being read: delivery dropped", d.topic)
            return
        queue.append(
            _new_delivery(d.topic, source, incarnation, seq, payload[_STAMP_SIZE:], d.own, stamp)
        )
        if sub._parked:
            sub._parked = False
            sub._waiting.unpark_all()

    def _trace_event(
        self, event: str, topic: str, source: int | None, seq: int | None, inc: int | None = None
    ) -> None:
        if self._trace is not None:
            self._trace(event, topic, source, seq, self.incarnation if inc is None else inc)

    def _link(self, dest: int) -> _Link:
        link = self._links.get(dest)
        if link is None:
            link = self._links[dest] = _Link(self, dest)
            assert self._nursery is not None
            self._nursery.start_soon(link.run)
        return link

    # ------------------------------------------------------------- network

    def verify(self, record: bytes) -> Peer:
        """Check a discovery record (fleet membership and signature) before dialling."""
        return verified_peer(self.fleet, record)

    @property
    def record(self) -> bytes:
        """This node's signed discovery record (set once it listens)."""
        return self.machine.record

    @record.setter
    def record(self, record: bytes) -> None:
        self.machine.record = record

    def known_records(self) -> list[bytes]:
        """This node's record and those of the peers it believes up."""
        return self.machine.known_records()

    async def dial(self, peer: Peer) -> tuple[trio.SocketStream, SecureSession]:
        """Connect and authenticate; the peer must prove the id discovery announced."""
        stream, session = await self.dial_address(peer.host, peer.port)
        if session.peer_id != peer.node_id:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            raise SecurityError(f"dialled {peer.node_id:016x} but {session.peer_id:016x} answered")
        return stream, session

    async def dial_address(self, host: str, port: int) -> tuple[trio.SocketStream, SecureSession]:
        """Connect to ``host:port`` and authenticate whichever fleet member answers."""
        stream, session, _ = await dial_secure(
            host, port, self.identity, self.fleet, self.config.handshake_timeout, self._revoked
        )
        return stream, session

    def _on_exchange(self, sender: int, exchange: PeerExchange) -> None:
        """Learn the verified records of a peer exchange, answer it, and pass news on.

        Invariant: a record reaches ``add_peer`` only after ``verify``; news goes
        to this node's VCube neighbours (not back to ``sender``), so a join
        floods the overlay once, and a reply goes only where one was asked.
        """
        now = trio.current_time()
        before = self.machine.records_learned
        self._handle(self.machine.exchange(sender, exchange.records, exchange.reply, now), now)
        self.stats["records_learned"] += self.machine.records_learned - before
        if exchange.reply and sender not in self.peers:
            log.warning("peer %016x asked for records without sending its own", sender)

    async def _seed(self, address: str) -> None:
        """Exchange peers with one seed now and every ``seed_interval`` seconds."""
        host, port = parse_address(address)
        backoff = 0.25
        while True:
            try:
                await self._exchange_with(host, port)
            except _ONE_OFF_ERRORS as exc:
                self.quiet.warn(("seed", address), "seed %s unreachable: %s", address, _why(exc))
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self.config.seed_interval)
                continue
            backoff = 0.25
            await trio.sleep(self.config.seed_interval)

    async def _exchange_with(self, host: str, port: int) -> None:
        """Send our records to ``host:port`` asking for its own (it answers on its link)."""
        async with self._dialled(host, port) as (stream, session):
            if session.peer_id == self.id:
                return  # the seed list names this node itself
            self._seeded[session.peer_id] = (host, port)
            records = self.known_records()
            for i in range(0, len(records), EXCHANGE_CHUNK):
                last = i + EXCHANGE_CHUNK >= len(records)
                ex = PeerExchange(tuple(records[i : i + EXCHANGE_CHUNK]), reply=last)
                await stream.send_all(frame(session.seal(encode_packets([], ex))))

    @asynccontextmanager
    async def _dialled(
        self, host: str, port: int
    ) -> AsyncIterator[tuple[trio.SocketStream, SecureSession]]:
        """A one-off authenticated connection (no link), closed however the block ends."""
        stream, session = await self.dial_address(host, port)
        try:
            yield stream, session
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def serve(self, stream: trio.SocketStream) -> None:
        """One accepted connection: authenticate, then feed its frames to the core.

        Before the handshake completes a peer gets almost nothing: a slot among
        ``max_handshakes`` (and ``max_handshakes_per_host`` per source address,
        loopback excepted), ``handshake_timeout`` seconds, and handshake
        messages of at most ``MAX_HANDSHAKE_SIZE`` bytes, refused on their
        length prefix before a byte is buffered."""
        host = remote_host(stream)
        if not self._make_room(host):
            with trio.CancelScope(shield=True):
                await stream.aclose()
            return
        peer = "unauthenticated peer"
        session_peer: int | None = None
        self.connections += 1
        ticket = self._tickets = self._tickets + 1
        scope = trio.CancelScope()
        self._handshakes[ticket] = (host, scope)
        try:
            try:
                with scope:
                    session, messages = await accept_secure(
                        stream,
                        self.identity,
                        self.fleet,
                        self.config.max_frame + 64,
                        self.config.handshake_timeout,
                        self._revoked,
                    )
            finally:
                self._handshakes.pop(ticket, None)
            if scope.cancelled_caught:
                return  # evicted by a newer connection (_make_room)
            session_peer = session.peer_id
            peer = f"{session_peer:016x}"
            await self._read_frames(messages, session)
        except (
            SecurityError,
            WireError,
            RemoteProtocolError,
            RemoteDetectorError,
            trio.TooSlowError,
        ) as exc:
            self.stats["rejected_connections"] += 1
            if session_peer is None:  # junk: a debug line each, a warning per 10 s
                log.debug("closing connection from %s: %s", peer, _why(exc))
                self.quiet.warn(
                    ("junk", None),
                    "closing connections of unauthenticated peers (%s: %s)",
                    host,
                    _why(exc),
                )
            else:  # a member's fault: every time
                log.warning("closing connection from %s: %s", peer, _why(exc))
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, EOFError):
            pass
        finally:
            self.connections -= 1
            with trio.CancelScope(shield=True):
                await stream.aclose()

    def _make_room(self, host: str) -> bool:
        """Admit a new connection from ``host``, evicting the oldest handshake
        under way where a cap is reached (``False``: refused, nothing to evict).

        Eviction, not refusal: junk that holds every handshake slot (or file
        descriptor) for ``handshake_timeout`` would otherwise lock members out,
        while a member's handshake takes milliseconds, so the oldest pending
        one is the likeliest junk.  Invariant: at most ``max_handshakes``
        pending (``max_handshakes_per_host`` per address, loopback excepted)
        and ``max_connections`` open, the latter also kept below the
        process's file descriptor limit."""
        cfg = self.config
        pending = self._handshakes
        mine = [t for t, (h, _) in pending.items() if h == host]
        if len(mine) >= cfg.max_handshakes_per_host and not is_loopback(host):
            self._evict(mine[0], f"{len(mine)} handshakes from {host} (max_handshakes_per_host)")
        elif len(pending) >= cfg.max_handshakes:
            self._evict(next(iter(pending)), f"{len(pending)} handshakes (max_handshakes)")
        elif self.connections >= self._max_connections:
            if not pending:
                self._refuse(host, f"{self.connections} connections open (max_connections)")
                return False
            self._evict(next(iter(pending)), f"{self.connections} connections (max_connections)")
        return True

    def _evict(self, ticket: int, why: str) -> None:
        host, scope = self._handshakes.pop(ticket)
        scope.cancel()
        self._refuse(host, why)

    def _refuse(self, host: str, why: str) -> None:
        """Count a refused or evicted connection; one log line per 10 s, however many."""
        self.stats["refused_connections"] += 1
        self.quiet.warn(
            ("refused", None),
            "refusing connections (%d so far), e.g. from %s: %s",
            self.stats["refused_connections"],
            host,
            why,
        )

    async def _read_frames(self, messages: Messages, session: SecureSession) -> None:
        """Decode, check and hand every packet to the core, in arrival order.

        Every frame is a sign of life of its sender, with the detector version
        it carries: one dict write here, handed to the detector at its next
        timer (``NodeMachine.handle_timer``)."""
        peer = session.peer_id
        heard = self._heard
        alive_set, dead = self._alive, self._dead
        link, lseq, first = await self._link_hello(messages, session)
        revoked = self._revoked
        while True:
            if first is not None:
                plain, first = first, None
            elif (record := await messages.next()) is not None:
                plain = session.open(record)
            else:
                return
            if peer in revoked:  # checked after the wait: the list may have come meanwhile
                raise SecurityError(f"{peer:016x} was revoked by the fleet")
            if link:
                lseq += 1
                if not self._received.fresh(peer, link, lseq):
                    self.stats["frames_duplicate"] += 1
                    if not messages.ready:
                        await messages.stream.send_all(frame(session.seal(encode_ack(lseq))))
                    continue
            body = decode_body(plain, self._limits)
            if peer in dead and peer not in alive_set and body.packets:
                self._restarted_by(peer, body.packets)
            alive = body.alive
            if alive is None:
                heard.setdefault(peer, None)
            else:
                seen = heard.get(peer)
                heard[peer] = alive if seen is None or seen < alive else seen
            self.stats["frames_received"] += 1
            self.stats["bytes_received"] += len(plain) + _RECORD_OVERHEAD
            now = trio.current_time()  # every packet of a frame arrived together
            for packet in body.packets:
                self.stats["packets_received"] += 1
                self._handle(self.core.receive(peer, packet, now), now)
            if body.control:
                self._on_control(peer, body.control)
            if body.exchange is not None:
                self._on_exchange(peer, body.exchange)
            if link and (not messages.ready or lseq % ACK_EVERY == 0):
                await messages.stream.send_all(frame(session.seal(encode_ack(lseq))))

    async def _link_hello(
        self, messages: Messages, session: SecureSession
    ) -> tuple[int, int, bytes | None]:
        """The link a connection carries and the ``lseq`` before its first frame,
        read from its first record; ``(0, 0, plaintext)`` for a connection with no
        hello (a one-off, such as a seed's exchange, whose frames are all new),
        with the first record's plaintext still to handle."""
        record = await messages.next()
        if record is None:
            return 0, 0, None
        plain = session.open(record)
        hello = Hello.parse(plain)
        if hello is None:
            return 0, 0, plain
        self._received.opened(session.peer_id, hello)
        return hello.link, hello.first - 1, None

    def _restarted_by(self, peer: int, packets: list[Packet]) -> None:
        """Core packets from ``peer``, which this node believes crashed: the
        rounds it starts name its incarnation, and a newer one than any known
        is a restart, learnt before the packets reach the core.  Otherwise the
        answers to them (the ACK of a re-subscription after a false suspicion)
        would be dropped as sent to a crashed node, and the round would never
        complete; the detector's news of the restart travels in the same frame
        but is read after the packets."""
        incs = [p.round.incarnation for p in packets if p.round.source == peer]
        now = trio.current_time()
        self._handle(self.machine.restarted_by(peer, incs, now), now)

    # ------------------------------------------------------------- liveness

    def _on_control(self, sender: int, control: tuple[Control, ...]) -> None:
        """Detector messages go to the detector, a leave makes ``sender`` leave.

        Raises :class:`RemoteDetectorError` (the connection is closed) on a
        message the detector refuses; a node without a detector ignores them.
        """
        now = trio.current_time()
        for c in control:
            if isinstance(c, Leave):
                self._on_leave(sender, c.incarnation, now)
            elif isinstance(c, Members):
                self._handle(self.machine.on_digest(sender, c.digest, now), now)
                self._compare_revocations(sender, c.revocations)
            elif isinstance(c, Revoked):
                self._on_revoked(sender, c.blob, now)
            else:
                self._handle(self.machine.control(sender, c, now), now)

    # ---------------------------------------------------------- revocation

    def _compare_revocations(self, sender: int, theirs: int) -> None:
        """``sender`` holds revocation list ``theirs``: send ours if newer, ask
        for its own (our digest and serial) if older."""
        mine = self._revocations.serial if self._revocations else 0
        if theirs < mine and sender in self.peers:
            assert self._revocations is not None
            self._link(sender).put_control(Revoked(self._revocations.encode()))
        elif theirs > mine and sender in self.peers:
            self._link(sender).put_control(Members(records_digest(self.known_records()), mine))

    def _on_revoked(self, sender: int, blob: bytes, now: float) -> None:
        """A revocation list from ``sender``: adopted if the fleet issued it and it
        is newer.  A forged one closes the connection (raises SecurityError)."""
        rl = RevocationList.decode(blob)
        rl.verify(self.fleet)
        self._adopt_revocations(rl, now)

    def _adopt_revocations(self, rl: RevocationList, now: float) -> None:
        """Adopt ``rl`` if newer: its nodes leave at once (links dropped, refused
        from now on), and the list goes on to this node's VCube neighbours."""
        if self._revocations is not None and rl.serial <= self._revocations.serial:
            return
        self._revocations = rl
        self.machine.revocation_serial = rl.serial
        fresh = sorted(rl.nodes - self._revoked - {self.id})
        self._revoked.update(rl.nodes - {self.id})
        if self.id in rl.nodes:
            log.error("the fleet revoked this node: its peers refuse it from now on")
        for node in fresh:
            log.warning("%016x revoked by the fleet (list %d): dropped", node, rl.serial)
            self._handle(self.machine.revoke(node, now), now)
        blob = Revoked(rl.encode())
        for neighbour in self.core.overlay.children(self.id, self.id):
            self._link(neighbour).put_control(blob)

    def _follow_revocation_file(self, now: float) -> None:
        """Adopt the revocation file when it appears or changes (one stat a round)."""
        path = self._revocation_file
        if path is None:
            return
        try:
            st = path.stat()
        except OSError:
            return
        seen = (st.st_mtime_ns, st.st_size)
        if seen == self._revocation_seen:
            return
        self._revocation_seen = seen
        try:
            rl = load_revocations(path, self.fleet)
        except IdentityError as exc:
            log.error("revocation list not adopted: %s", exc)
            return
        if rl is not None:
            self._adopt_revocations(rl, now)

    def _on_leave(self, sender: int, inc: int, now: float) -> None:
        """``sender``'s incarnation ``inc`` leaves: forgotten, not suspected."""
        self._handle(self.machine.left(sender, inc, "left", now), now)

    async def _detect(self) -> None:
        """Run the machine's timer: detector rounds every ``detector_interval``
        seconds on a fixed grid, and between rounds each probe's expiry at its
        deadline, so a suspicion takes ``timeout`` per attempt, not a round.
        A hint that probes earlier moves the sleep (:meth:`_unreachable`)."""
        machine = self.machine
        with self._detecting:
            machine.start_rounds(trio.current_time())
            while (due := machine.get_timer()) is not None:
                with trio.move_on_at(due) as wake:
                    self._detector_wake = wake
                    await trio.sleep_forever()
                self._detector_wake = None
                now = trio.current_time()
                self._handle(machine.handle_timer(now), now)

    def _new_life(self, node: int, life: int) -> None:
        """``node`` runs as ``life`` now.  A connection to an older life of it is
        closed (:meth:`_Link.redial`), and that address is told, on a
        connection of its own, that ``life`` is alive: a process the identity
        was started again over then stops (:class:`Superseded`) instead of
        running on unheard.  To a crashed life the notice goes nowhere."""
        link = self._links.get(node)
        old = None if link is None else link.redial(life)
        notice = None if old is None else self.machine.newer_life_notice(node)
        if old is not None and notice is not None and self._nursery is not None:
            self._nursery.start_soon(self._send_control_once, old.host, old.port, notice)

    async def _send_control_once(self, host: str, port: int, msg: Control) -> None:
        try:
            with trio.move_on_after(self.config.handshake_timeout):
                async with self._dialled(host, port) as (stream, session):
                    packet = encode_packets([], control=(msg,))
                    await stream.send_all(frame(session.seal(packet)))
        except _ONE_OFF_ERRORS as exc:
            log.debug("notice for %s:%d not sent: %s", host, port, _why(exc))

    def _superseded(self, o: Superseded) -> None:
        """Another process runs this identity, started later (a copied node
        directory): it keeps the identity, this node stops with
        :class:`IdentityInUseError`, raised in the node's nursery so that it
        ends the ``open_node`` block (and ``p2p node`` exits 1 with the
        message).  No LEAVE: the id stays a member, as the other process."""
        msg = (
            f"node {self.id:016x} was started again elsewhere (incarnation "
            f"{o.incarnation}, newer than this process's {self.incarnation}): "
            "this process stops; give every process its own node directory "
            "(`p2p fleet add-node`)"
        )
        if self._nursery is not None:  # the error is its one report (p2p node: one line)
            self._nursery.start_soon(_raise, IdentityInUseError(msg))

    def _stalled(self, o: Stalled) -> None:
        """Lifeguard's local health: the timer fired ``o.lag`` seconds late, so
        this process was not running (a busy CPU, a suspended process); the
        machine gave its probes more time.  Counted in ``stats["loop_stalls"]``;
        one log line per 10 s."""
        self.stats["loop_stalls"] += 1
        self.quiet.warn(
            ("stalled", None),
            "this node stalled %.2f s: %d probes given more time, nobody accused",
            o.lag,
            o.moved,
        )

    def _unreachable(self, node: int) -> None:
        """A hint from a link: the connection to ``node`` broke and re-dialling
        failed (what a crashed process's peers see).  The detector probes it now
        rather than at its next round; only unanswered probes make a suspicion."""
        if self._closed:
            return
        now = trio.current_time()
        self._handle(self.machine.hint(node, now), now)
        due = self.machine.get_timer()
        wake = self._detector_wake
        if due is not None and wake is not None and due < wake.deadline:
            wake.deadline = due

    def _reincarnated(self, o: Reincarnated) -> None:
        """Others treated this incarnation as crashed; the machine restarted the
        core as ``o.incarnation`` and re-subscribes (the outputs after this one).

        Core packets still queued belong to the dead incarnation and are
        dropped; ``publish(wait_acked=True)`` calls waiting on it return.  The
        trace shows it as the simulator shows a crash and a recovery (``crash``,
        ``recover``, then ``subscribe`` per topic), so the trace checks require
        of the new life only what it subscribed to anew.
        """
        self._trace_event("crash", "", None, None, o.previous)  # the old life ends
        self.stats["reincarnations"] += 1
        log.warning("this node was suspected: back as incarnation %d", o.incarnation)
        for link in self._links.values():
            link.log.discard()  # the old life's frames: not sent again to anyone
            kept = [x for x in link.outbox if isinstance(x, _NOT_CORE)]
            self.stats["lost_to_crash"] += len(link.outbox) - len(kept)
            link.outbox = deque(kept)
        for ev in self._acked.values():
            ev.set()
        self._acked.clear()
        if self.port:
            self.record = self._sign_record()
        self._trace_event("recover", "", None, None)
        for topic in sorted(self.machine.topics):
            self._subscribed.setdefault(topic, trio.Event())
            self._trace_event("subscribe", topic, None, None)

    def _sign_record(self) -> bytes:
        """This node's discovery record: its address and signed incarnation."""
        fields = {"host": self.config.interface, "port": self.port, INC_FIELD: self.incarnation}
        return sign_record(self.identity, fields, self.fleet)

    def _announce_leave(self) -> None:
        """On a clean close: tell every member believed up that this node leaves,
        behind whatever is queued for it (so they do not suspect it)."""
        if self.detector is None:
            return
        self._detecting.cancel()  # a leaving node accuses nobody (its view no longer matters)
        self._handle(self.machine.leave(trio.current_time()))

    async def _leave_unmet_seeds(self) -> None:
        """On a clean close: a seed that learnt this node but whose answer has not
        arrived (it is not in ``_alive``, so :meth:`_announce_leave` missed it)
        gets the LEAVE on a connection of its own, within ``drain_timeout``;
        otherwise it would suspect a node that left."""
        unmet = [a for n, a in self._seeded.items() if n not in self._alive and n not in self._dead]
        if self.detector is None or not unmet:
            return
        leave = Leave(self.incarnation)
        with trio.move_on_after(self.config.drain_timeout):
            async with trio.open_nursery() as nursery:
                for host, port in unmet:
                    nursery.start_soon(self._send_control_once, host, port, leave)

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
    with lock_identity(node_dir):
        async with _open_node(loaded, cfg, trace) as node:
            yield node


@asynccontextmanager
async def _open_node(
    loaded: tuple[NodeIdentity, Fleet], cfg: NodeConfig, trace: TraceHook | None
) -> AsyncIterator[Node]:
    identity, fleet = loaded
    quiet_accept_errors()
    node = Node(identity, fleet, cfg, trace)
    follow = cfg.revocation_file
    node._revocation_file = None if follow is None else Path(follow)
    async with trio.open_nursery() as nursery:
        listeners: list[Any] = await nursery.start(
            partial(trio.serve_tcp, node.serve, cfg.port, host=cfg.interface)
        )
        node.port = listeners[0].socket.getsockname()[1]
        node._nursery = nursery
        node.record = node._sign_record()
        node._follow_revocation_file(trio.current_time())
        if node.detector is not None:
            nursery.start_soon(node._detect)
        for seed in cfg.seeds:
            if not _names_self(seed, cfg.interface, node.port):
                nursery.start_soon(node._seed, seed)
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
            if cfg.discovery:
                discovery = Discovery(
                    interface=cfg.interface,
                    node_id=node.id,
                    port=node.port,
                    record=node.record,
                    verify=node.verify,
                    service_type=cfg.service_type,
                )
                async with discovery:
                    nursery.start_soon(node._discover, discovery)
                    _settle_heap()
                    yield node
                    node._announce_leave()
                    await node._leave_unmet_seeds()
                    await node._drain()
                    await node._last_upload()
            else:
                _settle_heap()
                yield node
                node._announce_leave()
                await node._leave_unmet_seeds()
                await node._drain()
                await node._last_upload()
        finally:
            node._closed = True
            nursery.cancel_scope.cancel()
            _close_recorder(node)


_ONE_OFF_ERRORS = (
    OSError,
    SecurityError,
    WireError,
    EOFError,
    trio.TooSlowError,
    trio.BrokenResourceError,
)
"""What a one-off connection (a seed exchange, a leave) may fail with: logged, not raised."""


async def _raise(exc: BaseException) -> None:
    """A task that fails with ``exc``: ends the nursery it runs in."""
    raise exc


def _incarnation_of(peer: Peer) -> int:
    """The incarnation ``peer``'s verified record announces (``p2p.runtime._liveness``)."""
    return record_incarnation(peer.record, peer.issued_at)


def _why(exc: BaseException) -> str:
    """A log line's reason: trio's timeouts and some OS errors have no message."""
    if isinstance(exc, trio.TooSlowError):
        return "timed out (handshake_timeout)"
    return str(exc) or type(exc).__name__


def _names_self(seed: str, interface: str, port: int) -> bool:
    """Whether ``seed`` is this node's own listening address (a fleet started
    with one seed list gives the seed its own address): dialling it would
    only cost a handshake with itself every ``seed_interval``."""
    host, seed_port = parse_address(seed)
    anywhere = interface in ("0.0.0.0", "::", "")
    return seed_port == port and (host == interface or (anywhere and is_loopback(host)))


def _settle_heap() -> None:
    """Once a node is up: collect the garbage start-up left, give the freed memory back
    to the OS (glibc's ``malloc_trim``; elsewhere nothing), and move every object
    alive now (the imported modules, the node) out of the cyclic collector's way
    with ``gc.freeze``, so that its full collections no longer walk the tens of
    thousands of objects of the imports (13 ms each on an idle core).

    Process-wide and harmless: frozen objects are still freed by reference
    counting; only a reference cycle among them would never be collected.
    """
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
    "Delivery",
    "MembershipEvent",
    "Node",
    "NodeConfig",
    "NodeError",
    "Subscription",
    "open_node",
    "parse_address",
]

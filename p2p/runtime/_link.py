"""Links: the per-peer outbox and writer, with reconnection and resending.

A :class:`_Link` owns the sending direction to one peer: it dials when there
is something to send, coalesces whatever queued meanwhile into one frame,
re-dials with capped backoff, and on a new connection sends again every frame
the peer has not confirmed (``p2p._reliable``).  Invariants: packets and
control packets beyond ``outbox_limit`` queued are dropped and counted, never
silently; a frame is kept until the peer confirms it on the same connection,
so a failed write loses nothing; only frames meant for an older life of a
restarted peer are forgotten, and counted (``stats["lost_on_disconnect"]``).

A link sees its node only through :class:`_LinkOwner` (the few counters,
tables and calls it needs), so this module does not import the node.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections import deque
from typing import Protocol

import trio

from p2p._errors import SecurityError
from p2p._membership import Peer
from p2p._reliable import CarriedAck, SendLog, decode_ack
from p2p._secure import SecureSession
from p2p._transport import Quiet
from p2p.runtime._config import NodeConfig
from p2p.runtime._liveness import incarnation_of
from p2p.wire import (
    Control,
    FrameReader,
    PeerExchange,
    WireError,
    WireLimits,
    encode_packets,
    frame,
    uint_size,
)
from topics import Packet
from vcube import Detector

log = logging.getLogger("p2p.node")


class _LinkOwner(Protocol):
    """What a link uses of its node (:class:`~p2p.runtime.Node`)."""

    config: NodeConfig
    stats: dict[str, int]
    peers: dict[int, Peer]
    quiet: Quiet
    connections: int
    leaving: bool
    _incs: dict[int, int]
    _room: trio.Event
    _eager: set[_Link]

    @property
    def record(self) -> bytes: ...

    @property
    def detector(self) -> Detector | None: ...

    async def dial(self, peer: Peer) -> tuple[trio.SocketStream, SecureSession]: ...

    def _unreachable(self, node: int) -> None: ...


_Item = Packet | PeerExchange | Control
"""What an outbox holds: core packets, control packets (detector messages, a
leave), and now and then a peer exchange."""

EXCHANGE_CHUNK = 256
"""Records per peer-exchange item (well under ``WireLimits.max_records``)."""


class _Link:
    """The outbox and writer of one peer (sending direction only)."""

    def __init__(self, node: _LinkOwner, peer_id: int) -> None:
        self.node = node
        self.peer_id = peer_id
        self.outbox: deque[_Item] = deque()
        self.wake = trio.Event()
        self.scope = trio.CancelScope()
        """Cancelled when the peer is suspected or leaves (:meth:`Node._drop_link`)."""
        self.control_bytes = 0
        """Bytes of control packets in the frame :meth:`_take` returned last."""
        self.alive_bytes = 0
        """Bytes of its piggybacked detector version (*alive*, ``p2p.wire``)."""
        self.log = SendLog(secrets.randbits(63) | 1, limit=node.config.unconfirmed_limit)
        """Frames sent and not yet confirmed by the peer (``p2p._reliable``)."""
        self.confirmed = False
        """Whether the peer confirmed a frame on the current connection (it works)."""
        self.connection: trio.CancelScope | None = None
        """The current connection's scope (:meth:`redial` closes it)."""
        self.dialled: Peer | None = None
        """The record the current connection was dialled from."""
        self.idle: tuple[trio.SocketStream, SecureSession] | None = None
        """The connection, while the writer waits for work on it with nothing
        half written: :meth:`write_now` may then write without waking it."""
        self.unsent = b""
        """The tail of a frame :meth:`write_now` could not write at once: the
        writer sends it before anything else on that connection."""
        self.carry = b""
        """A carried ack (``p2p._reliable``) to write ahead of the next frame
        made, set by :meth:`carry_ack`."""

    def carry_ack(self, ack: CarriedAck) -> bool:
        """Write ``ack`` (of the peer's link to this node) ahead of the frame
        :meth:`write_now` writes at the end of this step, if it writes one:
        something was queued this step on an idle connection with nothing half
        written.  ``False``: it will not, the caller sends the ack itself."""
        if self.idle is None or self.unsent or self not in self.node._eager:
            return False
        self.carry = ack.encode()
        return True

    def peer_acked(self, ack: CarriedAck) -> None:
        """The peer handled this link's frames up to ``ack.lseq`` (an ack it
        carried on its own link): forget them, as an ack on this link's
        connection would.  An ack of an earlier link of this node's is stale;
        :class:`WireError` if it confirms a frame never sent."""
        if ack.link != self.log.link:
            return
        self.log.acked(ack.lseq)
        if self.connection is not None:
            self.confirmed = True

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
        self.idle = None  # nothing more written on it, not even by write_now
        # Now, not at the next dial: frames logged from here on are the new
        # life's (a doomed connection may still take some) and are sent again.
        self._to_life(life)
        return self.dialled

    def _life_of(self, peer: Peer) -> int:
        """The peer's life a new connection carries frames for: the newest one
        known, from its record or from the membership (a peer that came back
        as a new incarnation in the same process keeps its address and its
        old record, and the node may learn the new life from the detector
        first).  Taking the record's older life here forgot the frames
        already logged for the new one, a repair of a SUB round among them,
        and the round waited for good (a healed partition: the fleet deaf)."""
        return max(incarnation_of(peer), self.node._incs.get(self.peer_id, 0))

    def _to_life(self, life: int) -> None:
        """Frames logged for another life of the peer are lost with it (counted)."""
        forgotten = self.log.reconnected(life)
        if forgotten:
            self.node.stats["lost_on_disconnect"] += forgotten
            log.warning("%016x restarted: %d packets to its old life lost", self.peer_id, forgotten)

    def core_packets(self) -> int:
        """Core packets queued (what the peer loses if the link is dropped now)."""
        return sum(1 for x in self.outbox if not isinstance(x, _NOT_CORE))

    def introduce(self, record: bytes) -> None:
        """Put this node's ``record`` ahead of everything queued: a peer learns a
        new incarnation of this node before any packet of it (it reads a
        frame's records before its packets)."""
        self.outbox.appendleft(PeerExchange((record,)))
        self.wake.set()

    def put_exchange(self, records: list[bytes], *, reply: bool) -> None:
        """Queue ``records`` for the peer, in chunks; only the last chunk asks for a reply."""
        chunks = [records[i : i + EXCHANGE_CHUNK] for i in range(0, len(records), EXCHANGE_CHUNK)]
        for i, chunk in enumerate(chunks):
            self.outbox.append(PeerExchange(tuple(chunk), reply and i == len(chunks) - 1))
        self.wake.set()

    def put(self, packets: list[Packet]) -> None:
        """Queue ``packets``; beyond the limit they are counted and logged, not kept.

        On an idle connection the node writes them itself at the end of the
        step that queued them (:meth:`write_now`, from ``Node._handle``, the
        only caller), one task switch sooner than the writer would."""
        room = self.node.config.outbox_limit - len(self.outbox)
        if len(packets) > room:
            lost = len(packets) - max(room, 0)
            self.node.stats["outbox_overflow"] += lost
            log.error("outbox to %016x full: %d packets not queued", self.peer_id, lost)
            packets = packets[: max(room, 0)]
        self.outbox.extend(packets)
        if self.idle is not None:
            self.node._eager.add(self)
        else:
            self.wake.set()

    def write_now(self) -> None:
        """Write the outbox as frames on the idle connection without waiting
        for the writer task; wake it for whatever this cannot finish (a full
        socket buffer, an error: the frames are in the log either way)."""
        idle = self.idle
        if idle is None or self.unsent:
            self.wake.set()
            return
        stream, session = idle
        while self.outbox:
            made = self._next_frame(session)
            if made is None:
                continue
            data, count = made
            try:
                sent = _write(stream.socket.fileno(), data)
            except OSError:  # full (the writer waits for room) or broken (it reconnects)
                sent = 0
            self._count_frame(len(data), count)
            if sent < len(data):
                self.unsent = data[sent:]
                self.wake.set()  # the writer finishes it, then the rest
                return

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
                if self.node.leaving:
                    # Closing: a peer that left at the same moment refuses the
                    # dial that carries our LEAVE; not worth a warning.
                    log.debug("cannot reach %016x while leaving: %s", peer.node_id, _why(exc))
                else:
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
                self.introduce(self.node.record)
            self._to_life(self._life_of(peer))
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
        """Until something is queued, or a frame :meth:`write_now` began is left
        to finish (its tail: the peer gets nothing more until it is written)."""
        while not self.outbox and not self.unsent:
            self.wake = trio.Event()
            await self.wake.wait()

    async def _pump(self, stream: trio.SocketStream, session: SecureSession) -> None:
        """Write everything queued, one frame per batch that fits ``max_frame``
        (after the tail :meth:`write_now` left, if any)."""
        try:
            while True:
                if self.unsent:
                    tail, self.unsent = self.unsent, b""
                    await stream.send_all(tail)
                if not self.outbox:
                    self.idle = (stream, session)
                    try:
                        await self._wait_for_work()
                    finally:
                        self.idle = None
                    continue
                made = self._next_frame(session)
                if made is None:
                    continue
                data, count = made
                await stream.send_all(data)
                self._count_frame(len(data), count)
        finally:
            self.unsent = b""  # its frame is in the log: the next connection resends it

    def _next_frame(self, session: SecureSession) -> tuple[bytes, int] | None:
        """The next frame of the outbox, logged and sealed, and the core packets
        in it (``None``: nothing to send)."""
        taken = self._take()
        if taken is None:
            return None
        count, body = taken
        lost = self.log.sent(body, count)  # kept until confirmed: a failed write loses nothing
        if lost:
            self.node.stats["lost_on_disconnect"] += lost
            log.error(
                "%016x confirms nothing: %d unconfirmed packets forgotten", self.peer_id, lost
            )
        carry, self.carry = self.carry, b""
        if carry:  # sealed first: the peer opens records in the order they were sealed
            return frame(session.seal(carry)) + frame(session.seal(body)), count
        return frame(session.seal(body)), count

    def _count_frame(self, size: int, count: int) -> None:
        """Count the frame :meth:`_next_frame` made last as sent: ``size`` bytes,
        ``count`` core packets (its control bytes are :attr:`control_bytes`)."""
        stats = self.node.stats
        stats["frames_sent"] += 1
        stats["packets_sent"] += count
        self.node._room.set()
        stats["bytes_sent"] += size
        control = self.control_bytes
        if control and not count:  # control packets only: its whole size
            stats["detector_bytes_sent"] += size
        else:
            stats["detector_bytes_sent"] += control + self.alive_bytes

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


_write = os.write
"""A non-blocking write to a connection's socket (trio's sockets are non-blocking)."""
_CONTROL = (*Control.__args__,)
_NOT_CORE = (PeerExchange, *_CONTROL)
_LASTED = 1.0
"""Seconds a connection must have lasted for its loss to reset a link's backoff."""


def _why(exc: BaseException) -> str:
    """A log line's reason: trio's timeouts and some OS errors have no message."""
    if isinstance(exc, trio.TooSlowError):
        return "timed out (handshake_timeout)"
    return str(exc) or type(exc).__name__

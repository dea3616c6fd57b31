"""Accepted connections and peer exchange: admission, the handshake, reading
frames into the machine, and the exchanges with seeds.

Invariants: before its handshake completes a connection gets a slot among
``max_handshakes`` (``max_handshakes_per_host`` per address), at most
``handshake_timeout`` seconds and handshake messages of bounded size.  A
burst of dials is accepted whole, in one turn of the loop; at a cap the
oldest pending connection whose peer never spoke is evicted, and when every
pending peer has spoken newcomers wait, queued in the listen backlog, for a
handshake to end (a connection is refused only when every one is taken by an
authenticated peer).  Every frame of an authenticated peer
is checked by ``p2p.wire`` before a packet reaches the core and handled in
arrival order; duplicates after a reconnection are dropped
(``p2p._reliable``).  A record reaches the machine only verified.
"""

from __future__ import annotations

import logging
import socket

import trio

from p2p._errors import SecurityError
from p2p._reliable import ACK_EVERY, CARRIED_HEAD, CarriedAck, Hello, encode_ack
from p2p._secure import SecureSession
from p2p._transport import (
    Messages,
    accept_secure,
    is_loopback,
    remote_host,
)
from p2p.machine import Refused
from p2p.runtime._driver import _Driver
from p2p.runtime._link import _Link, _why
from p2p.runtime._state import _Pending
from p2p.wire import (
    Body,
    Replay,
    Resume,
    WireError,
    decode_body,
    frame,
)
from topics import RemoteProtocolError
from vcube import RemoteDetectorError

log = logging.getLogger("p2p.node")

ACCEPT_BURST = 256
"""Most connections taken from the backlog in one turn of the event loop."""

SILENT_AFTER = 0.5
"""Seconds after which a pending connection whose peer has not spoken may be
evicted for a newcomer (a member sends its first handshake message with its
connection; the margin covers a loaded LAN or host)."""

_RECORD_OVERHEAD = 4 + 8 + 16
"""Bytes a frame adds to its plaintext: length prefix, seal counter, AEAD tag."""


class _Server(_Driver):
    """Serves accepted connections and exchanges peers (see the module docstring)."""

    async def accept(self, sock: socket.socket, nursery: trio.Nursery) -> None:
        """Accept connections on the listening ``sock`` (non-blocking) until
        cancelled, then close it; each is served in ``nursery``.

        A burst is taken whole: every connection waiting in the kernel's
        backlog is accepted in one turn of the event loop (up to
        :data:`ACCEPT_BURST`), where accepting one per turn let a seed dialled
        by a hundred newcomers, its loop busy, answer a handful a second and
        time them out.  Beyond ``max_handshakes`` (or ``max_connections``)
        under way, connections wait in the backlog, queued, until a handshake
        ends (:meth:`_admission_wait`)."""
        try:
            while True:
                await trio.lowlevel.wait_readable(sock)
                for _ in range(ACCEPT_BURST):
                    while (wait := self._admission_wait()) > 0:
                        self._slot_freed = trio.Event()
                        with trio.move_on_after(wait):
                            await self._slot_freed.wait()
                    try:
                        conn, _ = sock.accept()
                    except BlockingIOError:
                        break
                    except OSError as exc:  # out of descriptors, a reset: back off
                        self.quiet.warn(("accept", None), "cannot accept: %s", _why(exc))
                        await trio.sleep(0.1)
                        break
                    self._admit(conn, nursery)
        finally:
            sock.close()

    def _admit(self, conn: socket.socket, nursery: trio.Nursery) -> None:
        """Start serving an accepted connection, counted at once as a
        connection and a handshake under way (so :meth:`_admission_wait` sees it)."""
        conn.setblocking(False)
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(conn))
        self.connections += 1
        ticket = self._tickets = self._tickets + 1
        pending = _Pending(remote_host(stream), trio.CancelScope(), stream, trio.current_time())
        self._handshakes[ticket] = pending
        nursery.start_soon(self.serve, ticket, pending)

    def _admission_wait(self) -> float:
        """0 when the accept loop may take one more connection now, else the
        seconds to wait at most before asking again.

        Below the caps, now.  At ``max_handshakes`` under way or
        ``max_connections`` open: the oldest handshake whose peer has not
        spoken for :data:`SILENT_AFTER` seconds is evicted to make room (junk
        that holds every slot for ``handshake_timeout`` would otherwise lock
        members out, while a member's dial speaks at once); otherwise the new
        connection waits in the backlog for a handshake to end or a silent one
        to age.  With no handshake under way and every connection taken, it is
        accepted to be refused at once (:meth:`_make_room`) rather than left
        to time out.  Invariant: at most ``max_handshakes`` pending and
        ``max_connections`` open (the latter also kept below the process's
        descriptor limit)."""
        cfg = self.config
        pending = self._handshakes
        if not pending or (
            len(pending) < cfg.max_handshakes and self.connections < self._max_connections
        ):
            return 0.0
        now = trio.current_time()
        silent = [(p.since, t) for t, p in pending.items() if p.silent()]
        if not silent:
            return SILENT_AFTER
        since, ticket = min(silent)
        if now - since < SILENT_AFTER:
            return SILENT_AFTER - (now - since)
        if len(pending) >= cfg.max_handshakes:
            self._evict(ticket, f"{len(pending)} handshakes (max_handshakes)")
        else:
            self._evict(ticket, f"{self.connections} connections (max_connections)")
        return 0.0

    async def serve(self, ticket: int, pending: _Pending) -> None:
        """One accepted connection (:meth:`_admit`): authenticate, then feed its
        frames to the core.

        Before the handshake completes a peer gets almost nothing: a slot among
        ``max_handshakes`` (and ``max_handshakes_per_host`` per source address,
        loopback excepted), ``handshake_timeout`` seconds, and handshake
        messages of at most ``MAX_HANDSHAKE_SIZE`` bytes, refused on their
        length prefix before a byte is buffered."""
        stream, host = pending.stream, pending.host
        peer = "unauthenticated peer"
        session_peer: int | None = None
        try:
            if not self._make_room(ticket, host):
                return
            try:
                with pending.scope:
                    session, messages = await accept_secure(
                        stream,
                        self.identity,
                        self.fleet,
                        self.config.max_frame + 64,
                        self.config.handshake_timeout,
                        self._revoked,
                        pending.hear,
                    )
            finally:
                self._handshakes.pop(ticket, None)
                self._slot_freed.set()
            if pending.scope.cancelled_caught:
                return  # evicted to make room (_admission_wait, _make_room)
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
            self._handshakes.pop(ticket, None)
            self.connections -= 1
            self._slot_freed.set()
            with trio.CancelScope(shield=True):
                await stream.aclose()

    def _make_room(self, ticket: int, host: str) -> bool:
        """Admit the new connection ``ticket`` from its address, evicting that
        address's oldest handshake under way at ``max_handshakes_per_host``
        (loopback excepted); ``False``: refused, every connection is taken by
        an authenticated peer (:meth:`_admission_wait` let it in only to refuse it)."""
        cfg = self.config
        mine = [t for t, p in self._handshakes.items() if p.host == host and t != ticket]
        if len(mine) >= cfg.max_handshakes_per_host and not is_loopback(host):
            self._evict(mine[0], f"{len(mine)} handshakes from {host} (max_handshakes_per_host)")
        if self.connections > self._max_connections:
            self._refuse(host, f"{self.connections - 1} connections open (max_connections)")
            return False
        return True

    def _evict(self, ticket: int, why: str) -> None:
        pending = self._handshakes.pop(ticket)
        pending.scope.cancel()
        self._refuse(pending.host, why)

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
        link, lseq, first = await self._link_hello(messages, session)
        try:
            await self._read_loop(messages, session, link, lseq, first)
        finally:
            if self._eager:  # what the last frames queued, however the loop ended
                self._write_eager()

    async def _read_loop(
        self, messages: Messages, session: SecureSession, link: int, lseq: int, first: bytes | None
    ) -> None:
        """:meth:`_read_frames` after the link's hello: each new frame goes whole to
        ``NodeMachine.receive``, and a :class:`~p2p.machine.Refused` among its
        outputs (always the last) closes the connection."""
        peer = session.peer_id
        machine = self.machine
        stats = self.stats
        while True:
            if first is not None:
                plain, first = first, None
            elif (record := await messages.next()) is not None:
                plain = session.open(record)
            else:
                return
            if plain.startswith(CARRIED_HEAD):  # an ack of this node's link to the peer
                self._carried(peer, plain)
                continue
            if link:
                lseq += 1
                if not machine.frame_fresh(peer, link, lseq):
                    stats["frames_duplicate"] += 1
                    if not messages.ready:
                        await messages.stream.send_all(frame(session.seal(encode_ack(lseq))))
                    continue
            body = decode_body(plain, self._limits)
            stats["frames_received"] += 1
            stats["bytes_received"] += len(plain) + _RECORD_OVERHEAD
            stats["packets_received"] += len(body.packets)
            now = trio.current_time()  # every packet of a frame arrived together
            notes = self._notes_before(body)
            ack = link and (not messages.ready or lseq % ACK_EVERY == 0)
            back: _Link | None = None
            self._stepping = True  # one write per link for all the frame sends
            try:
                out = machine.receive(peer, body, now)
                self._handle(out, now)
                if ack and not messages.ready and not (out and type(out[-1]) is Refused):
                    back = self._links.get(peer)  # the ack rides on what goes back now
                    if back is not None and not back.carry_ack(CarriedAck(link, lseq)):
                        back = None
            finally:
                self._stepping = False
                if self._eager and not messages.ready:  # else after the last frame read
                    self._write_eager()
                self._hand_later()  # the application gets the frame's deliveries now
                self._write_frontier()  # and only then are they recorded as delivered
            if notes is not None:
                self._notes_after(peer, body, notes)
            if out and type(out[-1]) is Refused:
                raise RemoteProtocolError(out[-1].reason)
            if back is not None and not back.carry:
                stats["acks_carried"] += 1
            elif ack:
                if back is not None:
                    back.carry = b""  # no frame took it: sent here instead
                await messages.stream.send_all(frame(session.seal(encode_ack(lseq))))

    def _carried(self, peer: int, plain: bytes) -> None:
        """A carried ack from ``peer`` (``p2p._reliable``): its confirmation of this
        node's link to it.  :class:`WireError` if malformed or for a frame never sent."""
        out = self._links.get(peer)
        ack = CarriedAck.parse(plain)
        if out is not None:
            out.peer_acked(ack)

    def _notes_before(self, body: Body) -> tuple[int, int, int] | None:
        """What the machine counted before a frame with records or control messages
        (``None`` for the rest: nothing to note)."""
        if body.exchange is None and not body.control:
            return None
        rs = self.machine.recovery.stats
        return self.machine.records_learned, rs["resumes_refused"], rs["replays_unasked"]

    def _notes_after(self, peer: int, body: Body, before: tuple[int, int, int]) -> None:
        """Count the records learnt from ``peer``'s frame and log what the machine
        did not take of it (a refused RESUME, a REPLAY not asked for)."""
        machine = self.machine
        self.stats["records_learned"] += machine.records_learned - before[0]
        if body.exchange is not None and body.exchange.reply and peer not in machine.peers:
            log.warning("peer %016x asked for records without sending its own", peer)
        rs = machine.recovery.stats
        topics = [c.topic for c in body.control if isinstance(c, Resume | Replay)]
        if rs["resumes_refused"] > before[1]:
            self.quiet.warn(("resume refused", peer),
                            "resume of %016x on %r not answered (not a member, or too many)",
                            peer, topics[0])  # fmt: skip
        if rs["replays_unasked"] > before[2]:
            self.quiet.warn(("replay unasked", peer),
                            "replay of %016x on %r not taken (not asked for now)",
                            peer, topics[0])  # fmt: skip

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
        self.machine.link_opened(session.peer_id, hello)
        return hello.link, hello.first - 1, None

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
from p2p._reliable import ACK_EVERY, Hello, encode_ack
from p2p._secure import SecureSession
from p2p._transport import (
    Messages,
    accept_secure,
    is_loopback,
    parse_address,
    remote_host,
)
from p2p.runtime._driver import _ONE_OFF_ERRORS, _Driver
from p2p.runtime._link import EXCHANGE_CHUNK, _why
from p2p.runtime._state import _Pending
from p2p.wire import PeerExchange, WireError, decode_body, encode_packets, frame
from topics import Packet, RemoteProtocolError
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
        """:meth:`_read_frames` after the link's hello."""
        peer = session.peer_id
        heard = self._heard
        alive_set, dead = self._alive, self._dead
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
            if body.exchange is not None:
                # Records first: a peer back as a new incarnation sends its new
                # record ahead of its new life's packets, relayed ones
                # included, and an answer to a life taken for dead is lost.
                self._on_exchange(peer, body.exchange)
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
            self._stepping = True  # one write per link for all the frame sends
            try:
                for packet in body.packets:
                    self.stats["packets_received"] += 1
                    self._handle(self.core.receive(peer, packet, now), now)
            finally:
                self._stepping = False
            if self._eager and not messages.ready:  # else after the last frame read
                self._write_eager()
            if body.control:
                self._on_control(peer, body.control)
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

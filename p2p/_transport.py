"""Connections before and around the protocol: framing, the secure handshake
on a stream, admission helpers and log hygiene (the trio runtime's transport).

``dial_secure`` / ``accept_secure`` run :class:`~p2p._secure.SecureSession`'s
handshake over a TCP stream with a deadline; :class:`_Messages` reads
length-prefixed messages, refusing an unauthenticated peer's handshake
message above ``MAX_HANDSHAKE_SIZE`` on its length prefix, before a byte of
it is buffered.  Used by the node (``p2p.runtime``) and the telemetry collector.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Container

import trio

from p2p._errors import NodeError, SecurityError
from p2p._identity import Fleet, NodeIdentity
from p2p._membership import Peer
from p2p._secure import MAX_HANDSHAKE_SIZE, SecureSession, verify_record
from p2p.wire import FrameReader, WireLimits, frame

__all__ = [
    "Messages",
    "Quiet",
    "accept_secure",
    "dial_secure",
    "fd_budget",
    "is_loopback",
    "parse_address",
    "quiet_accept_errors",
    "remote_host",
    "verified_peer",
]

_RESPONDER_READS = 2
"""Handshake messages a responder reads (hello and finish of the three)."""


class Messages:
    """Length-prefixed messages from a stream, one at a time (extras wait their turn).

    The handshake and the data phase share it, so records that arrive in the
    same read as the last handshake message are kept, not rejected.
    """

    def __init__(self, stream: trio.SocketStream, max_frame: int, *, handshake: int = 0) -> None:
        """``handshake``: the first messages are the peer's handshake, each refused
        above ``MAX_HANDSHAKE_SIZE`` as soon as its length prefix arrives, before
        a byte of it is buffered (an unauthenticated peer gets almost nothing)."""
        self.stream = stream
        self.reader = FrameReader(
            WireLimits(max_frame=max_frame), tight=handshake, tight_max=MAX_HANDSHAKE_SIZE
        )
        self.ready: deque[bytes] = deque()

    async def next(self, limit: int | None = None) -> bytes | None:
        """The next message, or ``None`` at end of stream; ``limit`` bounds its size."""
        while not self.ready:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.ready.extend(self.reader.feed(data))
        msg = self.ready.popleft()
        if limit is not None and len(msg) > limit:
            raise SecurityError(f"handshake message of {len(msg)} bytes exceeds {limit}")
        return msg

    async def handshake(
        self, session: SecureSession, on_message: Callable[[], None] | None = None
    ) -> None:
        """Run ``session``'s handshake to completion over the stream;
        ``on_message`` is called after each peer message the session accepted."""
        while not session.established:
            msg = await self.next(MAX_HANDSHAKE_SIZE)
            if msg is None:
                raise EOFError("connection closed during the handshake")
            out, _ = session.receive_handshake(msg)
            if on_message is not None:
                on_message()
            if out:
                await self.stream.send_all(frame(out))


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as a pair; :class:`NodeError` if malformed."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise NodeError(f"expected HOST:PORT with a port in 1..65535, got {text!r}")
    return host, int(port)


def remote_host(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except OSError:  # already reset by the peer
        return "?"


def fd_budget() -> int:
    """Connections this process can hold: its file descriptor limit less a
    reserve for listeners, mDNS, logs and dials."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 30 if soft == resource.RLIM_INFINITY else max(8, soft - 48)


def is_loopback(host: str) -> bool:
    return host.startswith("127.") or host == "::1"


def verified_peer(fleet: Fleet, record: bytes) -> Peer:
    """The peer a discovery record names, once its signature and fleet membership check out."""
    vr = verify_record(fleet, record)
    return Peer(vr.node_id, vr.host, vr.port, record, vr.issued_at)


async def dial_secure(
    host: str,
    port: int,
    identity: NodeIdentity,
    fleet: Fleet,
    timeout: float,
    revoked: Container[int] = frozenset(),
) -> tuple[trio.SocketStream, SecureSession, Messages]:
    """Connect and run the initiator's handshake within ``timeout`` seconds.

    Returns the stream, the established session and the message reader, which
    may already hold records that followed the handshake.  The stream is closed
    if anything fails.
    """
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(host, port)
        try:
            session = SecureSession.initiator(identity, fleet, revoked=revoked)
            await stream.send_all(frame(session.start()))
            messages = Messages(stream, MAX_HANDSHAKE_SIZE)
            await messages.handshake(session)
        except BaseException:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            raise
    return stream, session, messages


async def accept_secure(
    stream: trio.SocketStream,
    identity: NodeIdentity,
    fleet: Fleet,
    max_message: int,
    timeout: float,
    revoked: Container[int] = frozenset(),
    on_message: Callable[[], None] | None = None,
) -> tuple[SecureSession, Messages]:
    """Run the responder's handshake on an accepted stream within ``timeout`` seconds.

    ``max_message`` bounds the records read after the handshake; the caller
    closes the stream on failure.  ``on_message``: see :meth:`Messages.handshake`.
    """
    with trio.fail_after(timeout):
        session = SecureSession.responder(identity, fleet, revoked=revoked)
        session.start()  # the responder speaks second: nothing to send yet
        messages = Messages(stream, max_message, handshake=_RESPONDER_READS)
        await messages.handshake(session, on_message)
    return session, messages


class Quiet:
    """Expected network failures (a peer unreachable, a connection lost, junk
    refused) logged once per cause and subject per ``interval``, with a count
    of those held back: a flapping link or a flood must not flood the log.
    Remembers at most ``limit`` subjects (junk has many addresses)."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0, limit: int = 1024) -> None:
        self.logger = logger
        self.interval = interval
        self.limit = limit
        self.seen: dict[tuple[str, object], tuple[float, int]] = {}

    def warn(self, key: tuple[str, object], msg: str, *args: object) -> None:
        """A warning, unless one of ``key`` was logged in the last ``interval``."""
        self._log(logging.WARNING, key, msg, args)

    def error(self, key: tuple[str, object], msg: str, *args: object) -> None:
        """An error (data lost here, e.g. deliveries dropped), held back like :meth:`warn`."""
        self._log(logging.ERROR, key, msg, args)

    def _log(self, level: int, key: tuple[str, object], msg: str, args: tuple[object, ...]) -> None:
        now = time.monotonic()
        last, held = self.seen.get(key, (-float("inf"), 0))
        if now - last < self.interval:
            self.seen[key] = (last, held + 1)
            return
        if held:
            msg = f"{msg} ({held} more like it in the last {self.interval:.0f} s)"
        self.seen.pop(key, None)
        self.seen[key] = (now, 0)
        while len(self.seen) > self.limit:
            del self.seen[next(iter(self.seen))]
        self.logger.log(level, msg, *args)


class _OncePer(logging.Filter):
    """Lets one record through per ``seconds``, without its traceback, and says
    how many it held back: expected overload errors (out of file descriptors
    in trio's accept loop, which backs off 0.1 s and retries) must not flood
    the log."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.last = -float("inf")
        self.held = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self.last < self.seconds:
            self.held += 1
            return False
        self.last = now
        record.exc_info = record.exc_text = None
        if self.held:
            record.msg = f"{record.msg} ({self.held} more since the last report)"
            self.held = 0
        return True


def quiet_accept_errors() -> None:
    """Install :class:`_OncePer` on trio's accept loop logger, once per process."""
    logger = logging.getLogger("trio.serve_listeners")
    if not any(isinstance(f, _OncePer) for f in logger.filters):
        logger.addFilter(_OncePer(10.0))

"""Peer discovery over mDNS / DNS-SD (python-zeroconf), bridged into trio.

python-zeroconf runs its own asyncio loop in a thread of its own.  This module
never calls trio from that thread except through the run's ``TrioToken``
(``run_sync_soon``), and never calls a blocking zeroconf function from the trio
thread except through ``trio.to_thread``.  Browser callbacks only enqueue the
service *name*; resolution (a blocking query) happens in a worker thread, and
the announced record is verified (``verify``) before the peer is reported.

Junk cannot stall it (an outsider's flood of services that never resolve, or
the stale records powered-off devices leave in mDNS caches): names resolve in
parallel, at most :data:`RESOLVE_AT_ONCE` new names at a time with a short
timeout, while names that already resolved (known members changing their
record) skip the queue; a name that failed is not tried again before a backoff
(doubling up to :data:`RETRY_MAX` seconds); at most :data:`MAX_PENDING` new
names wait at once, the rest are dropped and counted; and no zeroconf error
ends the node (one log line per name).

A node announces one service ``<hex id>.<service type>`` on the interface it
was given (``127.0.0.1`` keeps everything on loopback).  Its TXT properties
carry the node's signed discovery record split into 200-byte chunks
``r0 .. rN`` (DNS-SD limits one string to 255 bytes).

Browsing does not wait for the announcement: the browser starts first and
the registration runs beside it on zeroconf's loop (``async_register_service``);
peers found meanwhile are reported at once, and ``Discovery`` is entered as
soon as zeroconf listens.  The name is announced without probing it first
(``cooperating_responders``; RFC 6762 §8.1 probes for about 1.2 s: a random
150-250 ms, then three probes 500 ms apart).  A probe exists to pick another
name when the one wanted is taken; ours is the hex of the node id and carries
a signed record, so whoever else answers for it is a squatter, a stale cache
entry or a copy of this node's identity, and the node must be announced all
the same (peers verify what they resolve).  Probing would change nothing but
delay every node's first appearance by those 1.2 s, and a squatter could make
the registration fail.  A registration that fails anyway is one error line,
not the end of the node: its peers still learn of it when it dials the ones
it finds, as from any other hint.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from p2p._errors import P2PError
from p2p._membership import Peer

if TYPE_CHECKING:  # asyncio (zeroconf's) loads when discovery starts, not on import
    import concurrent.futures

SERVICE_TYPE = "_vcubeps._tcp.local."
CHUNK = 200
MAX_RECORD = 4096
"""Largest discovery record accepted, in bytes (bounded: it comes from the LAN)."""

RESOLVE_AT_ONCE = 8
"""New service names resolved at the same time."""
RESOLVE_TIMEOUT_MS = 1500
"""How long one resolution may take (zeroconf's query timeout)."""
MAX_PENDING = 256
"""New names waiting for resolution at most; more are dropped (counted in ``dropped``)."""
RETRY_FIRST = 5.0
RETRY_MAX = 300.0
"""Backoff before a name that did not resolve is tried again: from ``RETRY_FIRST``
seconds, doubling, up to ``RETRY_MAX``."""

log = logging.getLogger("p2p.discovery")


class DiscoveryError(P2PError):
    """Discovery could not start, or a record was unusable."""


@dataclass(frozen=True, slots=True)
class PeerEvent:
    """``kind`` is ``"up"`` (appeared or changed) or ``"down"`` (its service left)."""

    kind: str
    peer: Peer


Verify = Callable[[bytes], Peer]
"""Checks a record's signature and fleet membership; raises on a forged record."""


def chunk_record(record: bytes) -> dict[bytes, bytes]:
    """TXT properties ``r0..rN`` carrying ``record`` (inverse of :func:`join_record`)."""
    if len(record) > MAX_RECORD:
        raise DiscoveryError(f"discovery record of {len(record)} bytes exceeds {MAX_RECORD}")
    count = max(1, math.ceil(len(record) / CHUNK))
    return {f"r{i}".encode(): record[i * CHUNK : (i + 1) * CHUNK] for i in range(count)}


def join_record(props: dict[bytes, bytes | None]) -> bytes:
    """The record carried by TXT properties; raises :class:`DiscoveryError` if malformed."""
    parts: list[bytes] = []
    for i in range(MAX_RECORD // CHUNK + 1):
        part = props.get(f"r{i}".encode())
        if part is None:
            break
        parts.append(part)
    record = b"".join(parts)
    if not record or len(record) > MAX_RECORD:
        raise DiscoveryError("service carries no usable discovery record")
    return record


async def _register(zc: Any, info: Any) -> None:
    """On zeroconf's loop: announce ``info`` without probing its name (the module
    doc says why), and return once every announcement is sent."""
    broadcast = await zc.async_register_service(info, cooperating_responders=True)
    await broadcast


class Discovery:
    """Announce this node and report verified peers on one interface.

    Use as ``async with Discovery(...) as d: async for event in d.events(): ...``.
    Invariant: every ``up`` event carries a record that passed ``verify`` and whose
    node id is not ours; a name that fails verification is logged and ignored.
    """

    def __init__(
        self,
        *,
        interface: str,
        node_id: int,
        port: int,
        record: bytes,
        verify: Verify,
        service_type: str = SERVICE_TYPE,
        announce: bool = True,
    ) -> None:
        self.interface = interface
        self.announce = announce
        """``False``: only watch (``p2p status``), never appear as a member."""
        self.node_id = node_id
        self.port = port
        self.record = record
        self.verify = verify
        label = service_type.split(".")[0].lstrip("_")
        if not service_type.endswith("._tcp.local.") or not 0 < len(label) <= 15:
            raise DiscoveryError(
                f"service type {service_type!r} must look like _name._tcp.local. "
                "with a name of at most 15 bytes"
            )
        self.service_type = service_type
        self.name = f"{node_id:016x}.{service_type}"
        self._zc: Any = None
        self._info: Any = None
        self._browser: Any = None
        self._registration: concurrent.futures.Future[None] | None = None
        self.registered = trio.Event()
        """Set once this node's service is announced (never, with ``announce=False``
        or when the registration failed; see the module doc)."""
        self._names_in, self._names_out = trio.open_memory_channel[tuple[str, bool]](1024)
        self._events_in, self._events_out = trio.open_memory_channel[PeerEvent](1024)
        self._known: dict[str, Peer] = {}
        self._token: trio.lowlevel.TrioToken | None = None
        self._resolving: set[str] = set()
        self._gone: set[str] = set()
        self._retry: dict[str, tuple[float, float]] = {}
        """Names that did not resolve: when to try again, and the backoff after that."""
        self._limiter = trio.CapacityLimiter(RESOLVE_AT_ONCE)
        self._nursery_manager: Any = None
        self._nursery: trio.Nursery | None = None
        self.dropped = 0
        """New names not resolved because :data:`MAX_PENDING` were already waiting."""

    async def __aenter__(self) -> Discovery:
        self._token = trio.lowlevel.current_trio_token()
        try:
            await trio.to_thread.run_sync(self._start)
        except Exception as exc:  # zeroconf raises its own types; callers get ours
            raise DiscoveryError(f"cannot start mDNS on {self.interface}: {exc}") from exc
        self._nursery_manager = trio.open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        self._nursery.start_soon(self._dispatch)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()
                await self._nursery_manager.__aexit__(None, None, None)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._stop)

    def _start(self) -> None:
        """Open zeroconf, browse, and start the registration without waiting for it.

        Invariant: the browser runs before the registration is submitted, so a
        peer's service found while this node's announcements are under way is
        reported then, not after them (the module doc)."""
        import asyncio

        from zeroconf import IPVersion, ServiceBrowser, ServiceInfo, Zeroconf

        token = self._token
        assert token is not None
        self._zc = Zeroconf(interfaces=[self.interface], ip_version=IPVersion.V4Only)
        self._info = ServiceInfo(
            self.service_type,
            self.name,
            addresses=[socket.inet_aton(self.interface)],
            port=self.port,
            properties=chunk_record(self.record),
            server=f"{self.node_id:016x}.local.",
        )

        def on_change(zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
            # zeroconf's thread: hand the name to trio, nothing else.
            removed = state_change.name == "Removed"
            log.debug("mDNS %s %s", state_change.name, name)
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._offer, name, removed)

        self._browser = ServiceBrowser(self._zc, self.service_type, handlers=[on_change])
        if self.announce:
            registration = asyncio.run_coroutine_threadsafe(
                _register(self._zc, self._info), self._zc.loop
            )

            def on_done(future: concurrent.futures.Future[None]) -> None:
                # zeroconf's thread (or ours, if it was already done): hand over to trio.
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(self._registration_done, future)

            self._registration = registration
            registration.add_done_callback(on_done)

    def _registration_done(self, future: concurrent.futures.Future[None]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None:
            log.debug("mDNS service %s announced", self.name)
            self.registered.set()
        else:  # zeroconf raises its own types (NotRunningException, ...)
            log.error(
                "mDNS service %s not announced (%s); peers learn of this node when it "
                "dials the ones it finds",
                self.name,
                str(exc) or type(exc).__name__,
            )

    def _offer(self, name: str, removed: bool) -> None:
        try:
            self._names_in.send_nowait((name, removed))
        except trio.WouldBlock:
            log.error("discovery queue full (%d events unread): dropped %s", 1024, name)

    def _stop(self) -> None:
        if self._zc is None:
            return
        try:
            if self._browser is not None:
                self._browser.cancel()
            registration = self._registration
            # Still announcing: cancelled (close() says goodbye to whatever made
            # it into zeroconf's registry); announced: goodbye now.
            if (
                registration is not None
                and not registration.cancel()
                and registration.exception() is None
            ):
                self._zc.unregister_service(self._info)
        finally:
            self._zc.close()
            self._zc = None

    def _resolve(self, name: str) -> Peer | None:
        info = self._zc.get_service_info(self.service_type, name, timeout=RESOLVE_TIMEOUT_MS)
        if info is None:
            return None
        record = join_record(dict(info.properties))
        peer = self.verify(record)
        addresses = info.parsed_addresses()
        if not addresses or info.port is None:
            raise DiscoveryError(f"service {name} has no address")
        if (peer.host, peer.port) != (addresses[0], info.port):
            raise DiscoveryError(f"service {name} announces an address its record does not sign")
        return peer

    async def events(self) -> AsyncIterator[PeerEvent]:
        """Verified peer events: a name's events in the order its service changed."""
        async for event in self._events_out:
            yield event

    async def _dispatch(self) -> None:
        """Hand each service change to a resolver task (bounded, see the module doc)."""
        async for name, removed in self._names_out:
            if name == self.name:
                continue
            if removed:
                self._gone.add(name)
                peer = self._known.pop(name, None)
                if peer is not None:
                    self._emit(PeerEvent("down", peer))
                continue
            self._gone.discard(name)
            if name in self._resolving or not self._due(name):
                continue
            if name not in self._known and len(self._resolving) >= MAX_PENDING:
                self.dropped += 1
                continue
            assert self._nursery is not None
            self._resolving.add(name)
            self._nursery.start_soon(self._resolve_one, name)

    def _due(self, name: str) -> bool:
        retry = self._retry.get(name)
        return retry is None or trio.current_time() >= retry[0]

    async def _resolve_one(self, name: str) -> None:
        """Resolve and verify ``name``; a known member's name skips the queue."""
        try:
            if name in self._known:
                found = await trio.to_thread.run_sync(self._resolve, name, abandon_on_cancel=True)
            else:
                async with self._limiter:
                    found = await trio.to_thread.run_sync(
                        self._resolve, name, abandon_on_cancel=True
                    )
        except Exception as exc:  # a forged record (P2PError) or any zeroconf failure
            log.warning("ignoring service %s: %s", name, str(exc) or type(exc).__name__)
            found = None
        finally:
            self._resolving.discard(name)
        if found is None:
            self._failed(name)
            return
        self._retry.pop(name, None)
        if name in self._gone or found.node_id == self.node_id:
            return
        if self._known.get(name) != found:
            self._known[name] = found
            self._emit(PeerEvent("up", found))

    def _failed(self, name: str) -> None:
        """Back off on a name that did not resolve, then try it again (a member
        that was slow to answer once is not lost); bounded, the oldest go first."""
        delay = self._retry.get(name, (0.0, RETRY_FIRST))[1]
        self._retry[name] = (trio.current_time() + delay, min(delay * 2, RETRY_MAX))
        while len(self._retry) > MAX_PENDING:
            del self._retry[next(iter(self._retry))]
        assert self._nursery is not None
        self._nursery.start_soon(self._retry_later, name, delay)

    async def _retry_later(self, name: str, delay: float) -> None:
        await trio.sleep(delay)
        if name in self._retry and name not in self._gone:
            self._offer(name, False)

    def _emit(self, event: PeerEvent) -> None:
        try:
            self._events_in.send_nowait(event)
        except trio.WouldBlock:
            log.error(
                "discovery events unread: dropped %s of %016x", event.kind, event.peer.node_id
            )

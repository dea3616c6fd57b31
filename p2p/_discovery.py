"""Peer discovery over mDNS / DNS-SD (python-zeroconf), bridged into trio.

python-zeroconf runs its own asyncio loop in a thread of its own.  This module
never calls trio from that thread except through the run's ``TrioToken``
(``run_sync_soon``), and never calls a blocking zeroconf function from the trio
thread except through ``trio.to_thread``.  Browser callbacks only enqueue the
service *name*; resolution (a blocking query) happens in a worker thread, and
the announced record is verified (``verify``) before the peer is reported.

A node announces one service ``<hex id>.<service type>`` on the interface it
was given (``127.0.0.1`` keeps everything on loopback).  Its TXT properties
carry the node's signed discovery record split into 200-byte chunks
``r0 .. rN`` (DNS-SD limits one string to 255 bytes).
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import trio

from p2p._errors import P2PError

SERVICE_TYPE = "_vcubeps._tcp.local."
CHUNK = 200
MAX_RECORD = 4096
"""Largest discovery record accepted, in bytes (bounded: it comes from the LAN)."""

log = logging.getLogger("p2p.discovery")


class DiscoveryError(P2PError):
    """Discovery could not start, or a record was unusable."""


@dataclass(frozen=True, slots=True)
class Peer:
    """A verified peer: where to dial it, and the record that proved it."""

    node_id: int
    host: str
    port: int
    record: bytes
    issued_at: int = 0
    """The record's signing time (seconds): a newer record of a node replaces an older one."""


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
        self._names_in, self._names_out = trio.open_memory_channel[tuple[str, bool]](1024)
        self._known: dict[str, Peer] = {}
        self._token: trio.lowlevel.TrioToken | None = None

    async def __aenter__(self) -> Discovery:
        self._token = trio.lowlevel.current_trio_token()
        try:
            await trio.to_thread.run_sync(self._start)
        except Exception as exc:  # zeroconf raises its own types; callers get ours
            raise DiscoveryError(f"cannot start mDNS on {self.interface}: {exc}") from exc
        return self

    async def __aexit__(self, *exc: object) -> None:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._stop)

    def _start(self) -> None:
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
        if self.announce:
            self._zc.register_service(self._info)

        def on_change(zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
            # zeroconf's thread: hand the name to trio, nothing else.
            removed = state_change.name == "Removed"
            log.debug("mDNS %s %s", state_change.name, name)
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._offer, name, removed)

        self._browser = ServiceBrowser(self._zc, self.service_type, handlers=[on_change])

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
            if self._info is not None and self.announce:
                self._zc.unregister_service(self._info)
        finally:
            self._zc.close()
            self._zc = None

    def _resolve(self, name: str) -> Peer | None:
        info = self._zc.get_service_info(self.service_type, name, timeout=3000)
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
        """Verified peer events, in the order their services changed."""
        async for name, removed in self._names_out:
            if name == self.name:
                continue
            if removed:
                peer = self._known.pop(name, None)
                if peer is not None:
                    yield PeerEvent("down", peer)
                continue
            try:
                found = await trio.to_thread.run_sync(self._resolve, name)
            except P2PError as exc:
                log.warning("ignoring service %s: %s", name, exc)
                continue
            if found is None or found.node_id == self.node_id:
                continue
            if self._known.get(name) != found:
                self._known[name] = found
                yield PeerEvent("up", found)

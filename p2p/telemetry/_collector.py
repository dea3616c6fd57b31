"""Collection: devices upload their spool files to a collector over authenticated fleet connections.

The collector is a fleet member (its own ``p2p fleet add-node`` identity) that
listens on TCP.  Each upload runs over the fleet's secure channel (the same
handshake and sealed records as the pub/sub runtime), one file at a time::

    device -> collector   ["offer", name, size]
    collector -> device   ["resume", offset]   bytes of this file it already holds
                      or  ["have"]             the file has landed before: skip it
    device -> collector   ["chunk", bytes]...  from offset, at most CHUNK bytes each
    device -> collector   ["end", sha256]      of the whole file
    collector -> device   ["landed"]           written to the landing directory
                      or  ["error", reason]    the device retries from byte 0 later

Invariants:

* **No loss.** A device deletes a spool file only after ``landed`` or
  ``have``, and the collector answers ``landed`` only after the landing files
  are durably renamed into place.
* **No duplicates.** Landing file names come from the records they hold
  (``<boot>-<first seq>.cbor`` under ``date=<UTC day of t>/device=<id>``), and
  writing is an atomic replace.  Landing the same spool file twice, after a
  device or collector restart, rewrites identical files.
* **Resume.** A partial upload stays in ``LANDING/_incoming/<device>/<name>.part``
  and the next offer continues from its size.
* **A device uploads only its own records.** The device partition is the
  authenticated peer's id; records naming another device are dropped, counted
  and logged.  Bytes that do not decode (a record cut by a power loss) are kept
  at the end of the last landing file, for the Spark job to quarantine.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import cbor2
import trio

from p2p._errors import P2PError, SecurityError
from p2p._identity import Fleet, NodeIdentity
from p2p._secure import SecureSession
from p2p._transport import accept_secure, dial_secure, parse_address
from p2p.telemetry._recorder import Spool
from p2p.telemetry._schema import TelemetryError, iter_items
from p2p.wire import WireError, frame

log = logging.getLogger("p2p.telemetry")

CHUNK = 64 * 1024
"""Bytes per upload chunk."""

MAX_FILE = 64 << 20
"""Largest spool file a collector accepts."""

HANDSHAKE_TIMEOUT = 10.0
"""Seconds to connect and authenticate, either side."""

_NAME = re.compile(r"(\d{8})-(\d{12})-(\d{12})\.cbor")


class UploadError(TelemetryError):
    """An upload broke the protocol; the connection is closed and the file kept."""


def _msg(*parts: object) -> bytes:
    return cbor2.dumps(list(parts))


def _decode(data: bytes) -> list[Any]:
    """A protocol message: a non-empty CBOR array; :class:`UploadError` otherwise."""
    try:
        obj = cbor2.loads(data)
    except (cbor2.CBORDecodeError, ValueError, RecursionError) as exc:
        raise UploadError(f"undecodable message: {exc}") from None
    if not isinstance(obj, list) or not obj:
        raise UploadError(f"expected a message, got {str(obj)[:80]}")
    return obj


def _parse(data: bytes, kind: str, arity: int) -> list[Any]:
    obj = _decode(data)
    if obj[0] != kind or len(obj) != arity:
        raise UploadError(f"expected {kind!r} with {arity - 1} fields, got {str(obj)[:80]}")
    return obj


class _Channel:
    """Sealed CBOR messages over one authenticated stream."""

    def __init__(self, stream: trio.SocketStream, session: SecureSession, messages: Any) -> None:
        self.stream = stream
        self.session = session
        self.messages = messages

    async def send(self, *parts: object) -> None:
        await self.stream.send_all(frame(self.session.seal(_msg(*parts))))

    async def receive(self) -> bytes:
        record = await self.messages.next()
        if record is None:
            raise EOFError("connection closed")
        return bytes(self.session.open(record))

    async def expect(self, kind: str, arity: int) -> list[Any]:
        return _parse(await self.receive(), kind, arity)


# ------------------------------------------------------------------ collector


@dataclass
class CollectorStats:
    files_landed: int = 0
    files_skipped: int = 0
    bytes_received: int = 0
    records_landed: int = 0
    foreign_records: int = 0
    rejected_uploads: int = 0
    per_device: dict[str, int] = field(default_factory=dict)


class Collector:
    """Receives spool files and writes them to ``landing`` (see the module doc)."""

    def __init__(self, identity: NodeIdentity, fleet: Fleet, landing: str | Path) -> None:
        self.identity = identity
        self.fleet = fleet
        self.landing = Path(landing)
        self.incoming = self.landing / "_incoming"
        self.incoming.mkdir(parents=True, exist_ok=True)
        self.stats = CollectorStats()
        self.port = 0

    async def serve(self, stream: trio.SocketStream) -> None:
        """One device connection: authenticate, then take files until it hangs up."""
        peer = "unauthenticated peer"
        try:
            session, messages = await accept_secure(
                stream, self.identity, self.fleet, 2 * CHUNK, HANDSHAKE_TIMEOUT
            )
            peer = f"{session.peer_id:016x}"
            channel = _Channel(stream, session, messages)
            while True:
                try:
                    offer = await channel.receive()
                except EOFError:
                    return
                await self._take(channel, peer, _parse(offer, "offer", 3))
        except (UploadError, SecurityError, WireError, trio.TooSlowError) as exc:
            self.stats.rejected_uploads += 1
            log.warning("closing upload from %s: %s", peer, exc)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, EOFError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _take(self, channel: _Channel, device: str, offer: list[Any]) -> None:
        _, name, size = offer
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise UploadError(f"bad file name {str(name)[:80]!r}")
        if type(size) is not int or not 0 < size <= MAX_FILE:
            raise UploadError(f"bad file size {size!r}")
        folder = self.incoming / device
        folder.mkdir(exist_ok=True)
        ledger = folder / "landed.txt"
        if ledger.exists() and name in ledger.read_text().split():
            self.stats.files_skipped += 1
            await channel.send("have")
            return
        part = folder / (name + ".part")
        offset = part.stat().st_size if part.exists() else 0
        if offset > size:
            part.unlink()
            offset = 0
        await channel.send("resume", offset)
        with part.open("ab") as fh:
            while offset < size:
                (_, chunk) = _parse(await channel.receive(), "chunk", 2)
                if type(chunk) is not bytes or not 0 < len(chunk) <= min(CHUNK, size - offset):
                    raise UploadError("bad chunk")
                fh.write(chunk)
                fh.flush()
                offset += len(chunk)
                self.stats.bytes_received += len(chunk)
        (_, digest) = await channel.expect("end", 2)
        data = part.read_bytes()
        if hashlib.sha256(data).digest() != digest:
            part.unlink()
            await channel.send("error", "checksum mismatch: send it again")
            return
        records = await trio.to_thread.run_sync(self._land, device, data)
        with ledger.open("a") as fh:
            fh.write(name + "\n")
        part.unlink()
        self.stats.files_landed += 1
        self.stats.records_landed += records
        self.stats.per_device[device] = self.stats.per_device.get(device, 0) + records
        await channel.send("landed")

    def _land(self, device: str, data: bytes) -> int:
        """Write a spool file's records under their date and device; returns records kept.

        One landing file per UTC day the records fall in, named after its first
        record, so landing the same spool file again rewrites the same files.
        """
        groups: dict[str, tuple[str, list[bytes]]] = {}
        kept = 0
        last_day: str | None = None
        for item, err in iter_items(data):
            if err is not None:
                if last_day is not None:  # keep the undecodable tail for the job's quarantine
                    groups[last_day][1].append(data[_offset_of_error(err) :])
                break
            key = self._key(device, item)
            if key is None:
                continue
            day, name = key
            groups.setdefault(day, (name, []))[1].append(cbor2.dumps(item))
            last_day = day
            kept += 1
        for day, (name, parts) in groups.items():
            target = self.landing / f"date={day}" / f"device={device}" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(b"".join(parts))
            with tmp.open("rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        return kept

    def _key(self, device: str, item: object) -> tuple[str, str] | None:
        """(UTC day, landing file name) of a record, or ``None`` if it is not this device's."""
        if not isinstance(item, dict) or item.get("device") != device:
            self.stats.foreign_records += 1
            log.warning("dropping a record that does not belong to device %s", device)
            return None
        t, boot, seq = item.get("t"), item.get("boot"), item.get("seq")
        if not isinstance(t, int | float) or type(boot) is not int or type(seq) is not int:
            return "unknown", "00000000-000000000000.cbor"  # the job quarantines it
        try:
            day = dt.datetime.fromtimestamp(t, dt.UTC).date().isoformat()
        except (OverflowError, OSError, ValueError):
            day = "unknown"
        return day, f"{boot:08d}-{seq:012d}.cbor"


def _offset_of_error(err: str) -> int:
    match = re.search(r"at byte (\d+)", err)
    return int(match.group(1)) if match else 0


async def run_collector(
    identity: NodeIdentity,
    fleet: Fleet,
    landing: str | Path,
    *,
    interface: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[Collector] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve uploads until cancelled; ``task_status.started`` gets the collector (port set)."""
    collector = Collector(identity, fleet, landing)
    async with trio.open_nursery() as nursery:
        listeners: list[Any] = await nursery.start(
            partial(trio.serve_tcp, collector.serve, port, host=interface)
        )
        collector.port = listeners[0].socket.getsockname()[1]
        log.info("collector listening on %s:%d", interface, collector.port)
        task_status.started(collector)


# ------------------------------------------------------------------- device


@dataclass
class UploadStats:
    files_uploaded: int = 0
    bytes_sent: int = 0
    failures: int = 0


async def upload_spool(
    identity: NodeIdentity, fleet: Fleet, spool: Spool, address: str, stats: UploadStats
) -> None:
    """Send every complete spool file to the collector at ``address``, oldest first.

    A file is deleted only once the collector says it landed (or had it).
    Raises ``OSError``/``SecurityError``/``UploadError`` etc. on failure; the
    caller retries later, and the next attempt resumes where this one stopped.
    """
    files = spool.complete()
    if not files:
        return
    host, port = parse_address(address)
    stream, session, messages = await dial_secure(host, port, identity, fleet, HANDSHAKE_TIMEOUT)
    try:
        channel = _Channel(stream, session, messages)
        for path in files:
            await _upload_file(channel, path, stats)
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _upload_file(channel: _Channel, path: Path, stats: UploadStats) -> None:
    data = path.read_bytes()
    await channel.send("offer", path.name, len(data))
    answer = _parse_answer(await channel.receive())
    if answer[0] == "resume":
        offset = answer[1]
        if type(offset) is not int or not 0 <= offset <= len(data):
            raise UploadError(f"collector asked to resume at {offset!r}")
        for start in range(offset, len(data), CHUNK):
            await channel.send("chunk", data[start : start + CHUNK])
            stats.bytes_sent += min(CHUNK, len(data) - start)
        await channel.send("end", hashlib.sha256(data).digest())
        result = _parse_answer(await channel.receive())
        if result[0] != "landed":
            raise UploadError(f"collector refused {path.name}: {result[1:]}")
    path.unlink()
    stats.files_uploaded += 1


def _parse_answer(data: bytes) -> list[Any]:
    obj = _decode(data)
    if obj[0] not in ("resume", "have", "landed", "error"):
        raise UploadError(f"unexpected answer {str(obj)[:80]}")
    return obj


async def uploader(
    identity: NodeIdentity,
    fleet: Fleet,
    spool: Spool,
    address: str,
    *,
    interval: float = 30.0,
    stats: UploadStats | None = None,
) -> None:
    """Rotate and upload the spool every ``interval`` seconds, forever (retrying on failure)."""
    stats = stats or UploadStats()
    while True:
        await trio.sleep(interval)
        spool.rotate()
        try:
            await upload_spool(identity, fleet, spool, address, stats)
        except (OSError, P2PError, EOFError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            stats.failures += 1
            log.warning("telemetry upload to %s failed (will retry): %s", address, exc)


__all__ = [
    "CHUNK",
    "Collector",
    "CollectorStats",
    "UploadError",
    "UploadStats",
    "run_collector",
    "upload_spool",
    "uploader",
]

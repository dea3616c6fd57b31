"""The delivery frontier kept in the node directory, so a restarted subscriber
counts what it missed while it was down (``p2p.machine._frontier``).

The frontier (per topic and source, the ``(epoch, ordinal)`` delivered last)
is written after every batch of deliveries that moved it, in turn to two
files, ``PATH.0`` and ``PATH.1``, each a header (magic, a write counter, the
body's length and CRC-32) and a CBOR body, written in place with one
``pwrite``.  A process killed at any instant leaves both files as the kernel
has them (SIGKILL loses nothing written), so the newest valid one is exact.
Both are fsynced every ``frontier_interval`` seconds and at the close: a
power loss can cost the writes of the last interval, and can tear at most
the file being written, never the other.  Reading checks the size limit,
the CRC and the body's shape; with no valid file the node logs one line and
starts with no frontier (:class:`FrontierFileError`), never crashes.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import cbor2

from p2p._errors import P2PError

FRONTIER_FILE = "frontier"
"""The base name in the node directory (``frontier.0`` and ``frontier.1``)."""
MAX_FRONTIER_BYTES = 4 << 20
"""A frontier file larger than this is refused unread."""
_HEADER = struct.Struct(">4sQII")
_MAGIC = b"P2FR"

Frontiers = dict[str, dict[int, tuple[int, int]]]


class FrontierFileError(P2PError):
    """No frontier file can be used (unreadable, too large, corrupt)."""


class FrontierStore:
    """The two files of one frontier (see the module docstring).  Invariant:
    a write never touches the file that holds the newest valid frontier."""

    def __init__(self, path: Path) -> None:
        self.paths = (path.with_name(path.name + ".0"), path.with_name(path.name + ".1"))
        self._fds: list[int | None] = [None, None]
        self._sizes = [1 << 62, 1 << 62]
        """Each file's length after the last write (unknown at first: truncate)."""
        self._counter = 0
        self._newest = 1  # the next write goes to the other file

    def load(self) -> Frontiers:
        """The newest valid frontier kept (empty if there is none yet); raises
        :class:`FrontierFileError` when files exist and none can be trusted."""
        found: list[tuple[int, int, Frontiers]] = []
        errors: list[str] = []
        for slot, path in enumerate(self.paths):
            try:
                counter, frontiers = _read(path)
            except FileNotFoundError:
                continue
            except FrontierFileError as exc:
                errors.append(str(exc))
                continue
            found.append((counter, slot, frontiers))
        if not found:
            if errors:
                raise FrontierFileError("; ".join(errors))
            return {}
        self._counter, self._newest, frontiers = max(found)
        return frontiers

    def write(self, frontiers: Frontiers) -> None:
        """Write ``frontiers`` over the older of the two files (no fsync)."""
        body = cbor2.dumps(
            {
                topic: [[src, epoch, ordinal] for src, (epoch, ordinal) in per.items()]
                for topic, per in frontiers.items()
            }
        )
        self._counter += 1
        slot = 1 - self._newest
        data = _HEADER.pack(_MAGIC, self._counter, len(body), zlib.crc32(body)) + body
        fd = self._fd(slot)
        os.pwrite(fd, data, 0)
        if self._sizes[slot] > len(data):  # a shorter frontier: no stale tail
            os.ftruncate(fd, len(data))
        self._sizes[slot] = len(data)
        self._newest = slot

    def sync(self) -> None:
        """Make every write so far durable (fsync both files)."""
        for fd in self._fds:
            if fd is not None:
                os.fsync(fd)

    def close(self) -> None:
        for slot, fd in enumerate(self._fds):
            if fd is not None:
                os.close(fd)
                self._fds[slot] = None

    def _fd(self, slot: int) -> int:
        fd = self._fds[slot]
        if fd is None:
            fd = self._fds[slot] = os.open(self.paths[slot], os.O_RDWR | os.O_CREAT, 0o600)
            dirfd = os.open(self.paths[slot].parent, os.O_RDONLY)
            try:  # the new file's name survives a power loss too
                os.fsync(dirfd)
            finally:
                os.close(dirfd)
        return fd


def _read(path: Path) -> tuple[int, Frontiers]:
    """One file's write counter and frontier; raises ``FileNotFoundError`` or
    :class:`FrontierFileError`."""
    try:
        size = path.stat().st_size
        if size > MAX_FRONTIER_BYTES:
            raise FrontierFileError(f"{path} is {size} bytes (at most {MAX_FRONTIER_BYTES})")
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise FrontierFileError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) < _HEADER.size:
        raise FrontierFileError(f"{path} is corrupt (too short)")
    magic, counter, length, crc = _HEADER.unpack_from(data)
    body = data[_HEADER.size : _HEADER.size + length]
    if magic != _MAGIC or len(body) != length or zlib.crc32(body) != crc:
        raise FrontierFileError(f"{path} is corrupt (not a frontier file, or torn)")
    try:
        return counter, _frontiers(cbor2.loads(body), path)
    except (ValueError, cbor2.CBORDecodeError, RecursionError) as exc:
        raise FrontierFileError(f"{path} is corrupt: {exc}"[:300]) from None


def _frontiers(body: object, path: Path) -> Frontiers:
    """``body`` checked entry by entry (64-bit unsigned ids and numbers)."""
    bad = FrontierFileError(f"{path} is corrupt (not a frontier)")
    if not isinstance(body, dict):
        raise bad
    out: Frontiers = {}
    for topic, entries in body.items():
        if not isinstance(topic, str) or not isinstance(entries, list):
            raise bad
        per: dict[int, tuple[int, int]] = {}
        for entry in entries:
            if not (
                isinstance(entry, list)
                and len(entry) == 3
                and all(type(x) is int and 0 <= x < 1 << 64 for x in entry)
            ):
                raise bad
            src, epoch, ordinal = entry
            per[src] = (epoch, ordinal)
        out[topic] = per
    return out

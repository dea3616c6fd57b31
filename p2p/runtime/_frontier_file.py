"""The delivery frontier kept in the node directory, so a restarted subscriber
counts what it missed while it was down (``p2p.machine._frontier``).

``frontier.cbor`` holds, per topic and source, the ``(epoch, ordinal)`` the
node delivered last.  Written atomically (a temporary file, flushed and
fsynced, renamed over the old one, the directory fsynced), so a crash leaves
the old file or the new one, never a mix.  Read with a size limit and a
strict shape; a file that is missing starts from nothing, and one that is
unreadable or corrupt gives :class:`FrontierFileError` (the node logs one
line and starts from nothing: it never crashes on it).
"""

from __future__ import annotations

import os
from pathlib import Path

import cbor2

from p2p._errors import P2PError

FRONTIER_FILE = "frontier.cbor"
MAX_FRONTIER_BYTES = 4 << 20
"""A frontier file larger than this is refused unread."""
_VERSION = 1

Frontiers = dict[str, dict[int, tuple[int, int]]]


class FrontierFileError(P2PError):
    """The frontier file cannot be used (unreadable, too large, corrupt)."""


def save_frontiers(path: Path, frontiers: Frontiers) -> None:
    """Replace ``path`` with ``frontiers``, atomically and durably."""
    body = {
        "v": _VERSION,
        "frontiers": {
            topic: [[src, epoch, ordinal] for src, (epoch, ordinal) in sorted(per.items())]
            for topic, per in sorted(frontiers.items())
        },
    }
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(cbor2.dumps(body))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_frontiers(path: Path) -> Frontiers:
    """The frontiers kept in ``path`` (empty if there is none); raises
    :class:`FrontierFileError` on a file that cannot be trusted."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FrontierFileError(f"cannot read {path}: {exc.strerror}") from None
    if size > MAX_FRONTIER_BYTES:
        raise FrontierFileError(f"{path} is {size} bytes (at most {MAX_FRONTIER_BYTES})")
    try:
        body = cbor2.loads(path.read_bytes())
    except (OSError, ValueError, cbor2.CBORDecodeError, RecursionError) as exc:
        raise FrontierFileError(f"{path} is not a frontier file: {exc}"[:300]) from None
    return _frontiers(body, path)


def _frontiers(body: object, path: Path) -> Frontiers:
    """``body`` checked entry by entry (64-bit unsigned ids and numbers)."""
    bad = FrontierFileError(f"{path} is corrupt (not a version {_VERSION} frontier file)")
    if not isinstance(body, dict) or body.get("v") != _VERSION:
        raise bad
    topics = body.get("frontiers")
    if not isinstance(topics, dict):
        raise bad
    out: Frontiers = {}
    for topic, entries in topics.items():
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

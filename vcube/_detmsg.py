"""The failure detector's messages and their wire format (:mod:`vcube._detector`).

:class:`Probe`, :class:`Reply` and :class:`Push` (with their :class:`Entry`
rows) are what detectors send each other; :func:`encode_detector` gives the
CBOR arrays the module docstring of :mod:`vcube._detector` costs in bytes,
and :func:`decode_detector` reads them back.  A decoded message, or one a
driver hands to :meth:`~vcube._detector.Detector.receive`, may hold anything
a peer sent: these classes do not check their fields on construction
(:func:`_check_message` does, raising :class:`RemoteDetectorError`), so they
stay pure Python (``p2p._build`` leaves this module out of the compiled build).
"""

from __future__ import annotations

from vcube._errors import RemoteDetectorError
from vcube._hot import hot
from vcube._topology import MAX_ID

# ----------------------------------------------------------------- messages --


@hot
class Entry:
    """What a node knows of ``node``: its ``incarnation`` and event ``counter``."""

    node: int
    incarnation: int
    counter: int


@hot(kw_only=True)
class Probe:
    """A test: "are you alive, and what changed since your version ``since``?".

    ``incarnation`` and ``version`` are the prober's own; ``target`` is the
    incarnation of the probed node the prober knows (``since`` counts only for
    that incarnation).
    """

    round: int
    incarnation: int
    version: int
    target: int
    since: int


@hot(kw_only=True)
class Reply:
    """Answer to the probe of ``round``: the replier's ``incarnation``, the
    ``version`` the ``entries`` bring the prober up to, and those entries."""

    round: int
    incarnation: int
    version: int
    entries: tuple[Entry, ...] = ()


@hot(kw_only=True)
class Push:
    """Entries sent unasked down a VCube broadcast tree: the sender's
    ``incarnation`` and current ``version`` (not a sync point: a push holds
    only the entries that changed), and the changed ``entries``.

    The receiver merges them like a reply's and forwards them to its first
    correct node of every cluster below ``CLUSTER(receiver, sender)``.
    """

    incarnation: int
    version: int
    entries: tuple[Entry, ...] = ()


DetectorMessage = Probe | Reply | Push


# -------------------------------------------------------------- wire format --

_PROBE, _REPLY, _PUSH = 0, 1, 2


def encode_detector(msg: DetectorMessage) -> list[object]:
    """The CBOR-ready form of ``msg``: ``[0, round, incarnation, version, target,
    since]``, ``[1, round, incarnation, version, [node, inc, counter, ...]]`` or
    ``[2, incarnation, version, [node, inc, counter, ...]]``."""
    if isinstance(msg, Probe):
        return [_PROBE, msg.round, msg.incarnation, msg.version, msg.target, msg.since]
    flat = [x for e in msg.entries for x in (e.node, e.incarnation, e.counter)]
    if isinstance(msg, Push):
        return [_PUSH, msg.incarnation, msg.version, flat]
    return [_REPLY, msg.round, msg.incarnation, msg.version, flat]


def decode_detector(obj: object, *, max_entries: int = 4096) -> DetectorMessage:
    """Inverse of :func:`encode_detector`; raises :class:`RemoteDetectorError` on anything
    else (wrong shape, unknown kind, non-integer or out-of-range fields, too many
    entries)."""
    if not isinstance(obj, list | tuple) or not obj:
        raise RemoteDetectorError("detector message must be a non-empty array")
    kind, fields = obj[0], list(obj[1:])
    if not _is_uint(kind):
        raise RemoteDetectorError(f"detector message kind must be an integer, got {kind!r}")
    if kind == _PROBE and len(fields) == 5:
        r, inc, ver, target, since = fields
        msg: DetectorMessage = Probe(
            round=r, incarnation=inc, version=ver, target=target, since=since
        )
    elif kind == _REPLY and len(fields) == 4:
        r, inc, ver, flat = fields
        msg = Reply(round=r, incarnation=inc, version=ver, entries=_entries_of(flat, max_entries))
    elif kind == _PUSH and len(fields) == 3:
        inc, ver, flat = fields
        msg = Push(incarnation=inc, version=ver, entries=_entries_of(flat, max_entries))
    else:
        raise RemoteDetectorError(f"unknown detector message kind or arity: {kind!r}")
    _check_message(msg, max_entries)
    return msg


def _entries_of(flat: object, max_entries: int) -> tuple[Entry, ...]:
    """Entries from a flat ``[node, inc, counter, ...]`` array (checked by the caller)."""
    if not isinstance(flat, list | tuple) or len(flat) % 3:
        raise RemoteDetectorError("entries must be a flat array of triples")
    if len(flat) // 3 > max_entries:
        raise RemoteDetectorError(f"message holds {len(flat) // 3} entries, limit {max_entries}")
    return tuple(Entry(flat[k], flat[k + 1], flat[k + 2]) for k in range(0, len(flat), 3))


def _is_uint(x: object) -> bool:
    """An ``int`` (not ``bool``) in ``[0, 2^64)``: every field of the protocol."""
    return type(x) is int and 0 <= x <= MAX_ID


def _check_message(msg: object, max_entries: int) -> None:
    """Raise :class:`RemoteDetectorError` unless ``msg`` is a well-formed
    :class:`Probe`, :class:`Reply` or :class:`Push` within ``max_entries``.  Reads only."""
    if isinstance(msg, Probe):
        fields: tuple[object, ...] = (
            msg.round,
            msg.incarnation,
            msg.version,
            msg.target,
            msg.since,
        )
    elif isinstance(msg, Reply):
        fields = (msg.round, msg.incarnation, msg.version)
        _check_entries(msg.entries, max_entries)
    elif isinstance(msg, Push):
        fields = (msg.incarnation, msg.version)
        _check_entries(msg.entries, max_entries)
    else:
        raise RemoteDetectorError(f"unknown detector message kind {type(msg).__name__}")
    if not all(_is_uint(f) for f in fields):
        raise RemoteDetectorError(f"detector message fields must be uint64: {msg!r}")


def _check_entries(entries: object, max_entries: int) -> None:
    """Entries must be a tuple of at most ``max_entries`` :class:`Entry`, uint64
    fields, each node at most once."""
    if not isinstance(entries, tuple):
        raise RemoteDetectorError("entries must be a tuple")
    if len(entries) > max_entries:
        raise RemoteDetectorError(f"message holds {len(entries)} entries, limit {max_entries}")
    nodes: set[object] = set()
    ok = _is_uint
    for e in entries:
        if type(e) is not Entry or not (ok(e.node) and ok(e.incarnation) and ok(e.counter)):
            raise RemoteDetectorError(f"bad entry {e!r}")
        nodes.add(e.node)
    if len(nodes) != len(entries):
        raise RemoteDetectorError("entries list a node twice")

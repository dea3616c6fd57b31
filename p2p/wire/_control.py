"""The runtime-level packets that share a frame with the core's but never reach it
(DET, LEAVE, MEMBERS, REVOKED, RESUME, REPLAY: :data:`Control`) and the peer
exchange, with their encoding and their checked decoding."""

from __future__ import annotations

import cbor2

from p2p.wire._cbor import (
    _array,
    _ctr,
    _d_topic,
    _e_array,
    _e_bool,
    _e_bytes,
    _e_int,
    _e_topic,
    _int,
    _node,
)
from p2p.wire._limits import (
    _DET,
    _LEAVE,
    _MEMBERS,
    _REPLAY,
    _RESUME,
    _REVOKED,
    WireError,
    WireLimits,
)
from vcube import Probe, Push, RemoteDetectorError, Reply, decode_detector
from vcube import encode_detector as _detector_tree
from vcube._hot import hot


@hot
class PeerExchange:
    """Signed discovery records passed between members (peer exchange).

    ``reply`` asks the receiver to answer with the records it knows.  The
    records are unverified bytes until the receiver's ``verify_record`` says
    otherwise.
    """

    records: tuple[bytes, ...]
    reply: bool = False


@hot
class Leave:
    """The sender's ``incarnation`` leaves the fleet gracefully: forget it, suspect nothing."""

    incarnation: int


@hot
class Members:
    """A digest of the membership records the sender holds (anti-entropy,
    ``p2p._membership``): a receiver holding a different set answers with its
    records, so one-way discovery heals in both directions.  ``revocations``
    is the serial of the fleet revocation list the sender holds (0: none): a
    receiver holding a newer one sends it (``p2p._revocation``)."""

    digest: int
    revocations: int = 0


@hot
class Revoked:
    """The fleet's signed revocation list, as bytes (checked by the receiver)."""

    blob: bytes


MAX_REVOKED_BLOB = 64 * 1024
"""Largest revocation list a REVOKED packet may carry."""


@hot
class Resume:
    """The sender, a subscriber of ``topic``, delivered the receiver's publications
    on it up to ``(epoch, ordinal)`` (``p2p.machine._frontier``): it asks for
    what the receiver published after that and still holds."""

    topic: str
    epoch: int
    ordinal: int


@hot
class Replay:
    """Part ``part`` of ``parts`` of the answer to the :class:`Resume` for what
    came after ``(epoch, ordinal)`` on ``topic``: publications the sender
    made, oldest first, each as ``(incarnation, seq, payload, deps)`` (its
    id is the sender's; the payload starts with its envelope; ``deps``:
    ``(source, epoch, ordinal)`` of what it causally follows).  ``more``: the
    sender made more that it cannot give yet (their rounds are still on
    their way, and will not bring them to the asker): ask again."""

    topic: str
    epoch: int
    ordinal: int
    part: int
    parts: int
    entries: tuple[ReplayEntry, ...]
    more: bool = False


ReplayEntry = tuple[int, int, bytes, tuple[tuple[int, int, int], ...]]

MAX_REPLAY_ENTRIES = 256
"""Most publications one REPLAY packet carries (a longer answer takes several)."""
MAX_REPLAY_DEPS = 64
"""Most dependencies one replayed publication names."""
MAX_REPLAY_PARTS = 1024
"""Most REPLAY packets one answer takes."""

Control = Probe | Reply | Push | Leave | Members | Revoked | Resume | Replay
"""Runtime-level packets that travel with the core's but never reach it."""


def _e_control(c: Control) -> bytes:
    """``[4, detector message]``, ``[5, incarnation]`` or ``[6, digest]``,
    canonical CBOR (cbor2's)."""
    if isinstance(c, Leave):
        return b"\x82" + _e_int(_LEAVE) + _e_int(c.incarnation)
    if isinstance(c, Members):
        return b"\x83" + _e_int(_MEMBERS) + _e_int(c.digest) + _e_int(c.revocations)
    if isinstance(c, Revoked):
        return b"\x82" + _e_int(_REVOKED) + _e_bytes(c.blob)
    if isinstance(c, Resume):
        return b"\x84" + _e_int(_RESUME) + _e_topic(c.topic) + _e_int(c.epoch) + _e_int(c.ordinal)
    if isinstance(c, Replay):
        parts = [b"\x88", _e_int(_REPLAY), _e_topic(c.topic), _e_int(c.epoch), _e_int(c.ordinal)]
        parts += (_e_int(c.part), _e_int(c.parts), _e_bool(c.more), _e_array(len(c.entries)))
        for inc, seq, payload, deps in c.entries:
            parts += (b"\x84", _e_int(inc), _e_int(seq), _e_bytes(payload), _e_array(len(deps)))
            parts += (b"\x83" + _e_int(n) + _e_int(e) + _e_int(o) for n, e, o in deps)
        return b"".join(parts)
    return b"\x82" + _e_int(_DET) + cbor2.dumps(_detector_tree(c))


def _d_control(raw: list[object], lim: WireLimits) -> Control:
    """A DET, LEAVE or MEMBERS packet (tag already read); :class:`WireError` if malformed."""
    if raw[0] == _LEAVE:
        _, inc = _array(raw, "LEAVE", 2)
        return Leave(_ctr(inc, "LEAVE.incarnation"))
    if raw[0] == _MEMBERS:
        _, digest, serial = _array(raw, "MEMBERS", 3)
        return Members(_node(digest, "MEMBERS.digest"), _ctr(serial, "MEMBERS.revocations"))
    if raw[0] == _REVOKED:
        _, blob = _array(raw, "REVOKED", 2)
        if type(blob) is not bytes or not 0 < len(blob) <= MAX_REVOKED_BLOB:
            raise WireError(f"REVOKED: expected 1..{MAX_REVOKED_BLOB} bytes")
        return Revoked(blob)
    if raw[0] == _RESUME:
        _, topic, epoch, ordinal = _array(raw, "RESUME", 4)
        epoch, ordinal = _node(epoch, "RESUME.epoch"), _node(ordinal, "RESUME.ordinal")
        return Resume(_d_topic(topic, lim), epoch, ordinal)
    if raw[0] == _REPLAY:
        return _d_replay(raw, lim)
    _, msg = _array(raw, "DET", 2)
    try:
        return decode_detector(msg, max_entries=lim.max_detector_entries)
    except RemoteDetectorError as exc:
        raise WireError(f"DET: {exc}") from None


def _d_replay(raw: list[object], lim: WireLimits) -> Replay:
    """A REPLAY packet: at most :data:`MAX_REPLAY_ENTRIES` publications of at most
    ``max_payload`` bytes each (the receiving machine checks their envelopes)."""
    _, topic, epoch, ordinal, part, parts, more, raw_entries = _array(raw, "REPLAY", 8)
    if type(more) is not bool:
        raise WireError("REPLAY.more: expected a bool")
    epoch, ordinal = _node(epoch, "REPLAY.epoch"), _node(ordinal, "REPLAY.ordinal")
    parts = _int(parts, "REPLAY.parts", 1, MAX_REPLAY_PARTS + 1)
    part = _int(part, "REPLAY.part", 0, parts)
    entries: list[ReplayEntry] = []
    for v in _array(raw_entries, "REPLAY.entries", limit=MAX_REPLAY_ENTRIES):
        inc, seq, payload, raw_deps = _array(v, "REPLAY entry", 4)
        if type(payload) is not bytes or len(payload) > lim.max_payload:
            raise WireError(f"REPLAY payload: expected at most {lim.max_payload} bytes")
        deps = []
        for dep in _array(raw_deps, "REPLAY.deps", limit=MAX_REPLAY_DEPS):
            n, e, o = _array(dep, "REPLAY dep", 3)
            dep_epoch, dep_ordinal = _node(e, "REPLAY.epoch"), _node(o, "REPLAY.ordinal")
            deps.append((_node(n, "REPLAY.dep"), dep_epoch, dep_ordinal))
        ids = (_ctr(inc, "REPLAY.incarnation"), _ctr(seq, "REPLAY.seq"))
        entries.append((*ids, payload, tuple(deps)))
    return Replay(_d_topic(topic, lim), epoch, ordinal, part, parts, tuple(entries), more)


def _d_exchange(v: object, lim: WireLimits) -> PeerExchange:
    reply, records = _array(v, "exchange", 2)
    if type(reply) is not bool:
        raise WireError("exchange.reply: expected a bool")
    raw = _array(records, "exchange.records", limit=lim.max_records)
    if not raw:
        raise WireError("exchange without records")
    for r in raw:
        if type(r) is not bytes or not 0 < len(r) <= lim.max_record:
            raise WireError(f"exchange.record: expected 1..{lim.max_record} bytes")
    return PeerExchange(tuple(raw), reply)  # type: ignore[arg-type]

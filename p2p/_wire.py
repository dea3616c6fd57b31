"""Wire format of VCube-PS packets: CBOR frame bodies behind a 4-byte length prefix.

A TCP stream carries *frames*: a 4-byte big-endian unsigned length, then that
many bytes of *body*.  A body is one CBOR data item (RFC 8949) in a strict
subset: unsigned and negative integers, byte strings, UTF-8 text strings,
arrays, ``true`` and ``false``, all of definite length with every head in its
shortest form.  No maps, tags, floats, ``null``/``undefined``, other simple
values, indefinite lengths or trailing bytes.  Packets are compact arrays
whose first element is a type tag.

=======  ====================================================  ==============================
Item     CBOR                                                  Checks
=======  ====================================================  ==============================
body     ``[version, [packet, ...]]``                          version == 2; 1..max_packets
         or ``[version, [packet, ...], alive]``                1..max_packets
         or ``[version, [packet, ...], exchange]``             0..max_packets
         or ``[version, [packet, ...], alive, exchange]``      0..max_packets
alive    unsigned integer                                      < 2**64: the sender's detector
                                                               version (piggybacked)
exchange ``[reply: bool, [record: bytes, ...]]``               1..max_records, each 1..
                                                               max_record bytes
PUB      ``[0, round, topic, [message, ...], dests]``          <= max_round_messages; payload
                                                               sum <= max_round_bytes (when
                                                               more than one message)
SUB      ``[1, round, topic, op]``
UNS      ``[2, round, topic, op, dests]``
         or ``[2, round, topic, op, dests, [bound, ...]]`` (an announce's ``predates``)
         or ``[2, round, topic, op, dests, [bound, ...], [bound, ...]]`` (and ``beyond``)
ACK      ``[3, round, topic, [op, ...], [bound, ...]]``        each <= max_view_entries
         or ``[3, round, topic, [op, ...], [bound, ...], [bound, ...]]`` (``predates``)
         or ``[3, round, topic, [op, ...], [bound, ...], [bound, ...], [bound, ...]]``
         (and ``beyond``)
FENCE    ``[8, round, topic, id, step, [message, ...],``       ``topics.Fence``: id's seq is
         ``[message, ...]]`` (``messages``, ``others``)        the value plus one; step 0..4;
         or ``[8, ..., [message, ...], [id, ...]]``            each <= max_round_messages;
         (and ``marks``, each id's seq plus one)               marks <= max_view_entries
round    ``[source: node, incarnation: ctr, number: ctr]``     ``RoundId``
op       ``[node: node, incarnation: ctr, rc: ctr, bool]``     ``ViewEntry`` (subscribed)
bound    ``[node: node, incarnation: ctr, first_owned: ctr]``  ``Bound``
message  ``[id, payload: bytes, [id, ...], [id, ...], prev]``  ``PubMessage``: payload <=
         or ``[id, payload, [id, ...], [id, ...], prev, joins]``  max_payload; deps + op_deps <=
                                                               max_barrier; prev: -1 or ctr;
                                                               joins (``op_joins``, present
                                                               only when not 0): 1 ..
                                                               2**len(op_deps) - 1; from
                                                               2**64 on (64 ops or more)
                                                               its shortest big-endian
                                                               bytes
id       ``[source: node, incarnation: ctr, seq: ctr]``        ``causal.MsgId``
topic    text string                                           1..max_topic_len UTF-8 bytes
dests    ``[node, ...]``                                       strictly increasing; <=
                                                               max_dests
node     unsigned integer                                      < 2**64
ctr      unsigned integer                                      < 2**63
=======  ====================================================  ==============================

Four runtime-level *control* packets share the packets array (the core never
sees them):

=======  ====================================================  ==============================
DET      ``[4, detector message]``                             ``vcube.decode_detector``: a
                                                               Probe, Reply or Push, uint64
                                                               fields, <= max_detector_entries
LEAVE    ``[5, incarnation: ctr]``                             the sender leaves gracefully
MEMBERS  ``[6, digest: node, revocations: ctr]``              digest of the sender's member
                                                               records (``p2p._membership``),
                                                               its revocation list's serial
REVOKED  ``[7, list: bytes]``                                  the fleet's signed revocation
                                                               list (``p2p._revocation``)
=======  ====================================================  ==============================

*alive* is the sender's failure-detector version (``vcube.Detector.version``)
when the frame was encoded, carried by every frame of a node that runs a
detector: the receiver's detector takes the frame as a sign of life *and*
learns whether the sender has news, so a pull target whose data traffic shows
a version already synced needs no probe (``Detector.heard``).

An *exchange* is runtime-level peer exchange (static seeds, networks without
multicast): signed discovery records, checked by the receiver with
``verify_record`` before use; ``reply`` asks for the receiver's own list.

A :class:`~topics.Bundle` is link-level only: :func:`encode_packets` flattens
it into its packets, in order, and the receiver hands them to its core one by
one.

:func:`decode_packets` is the only gate between the network and a core.  It
first scans the raw bytes (well-formedness, the subset above, shortest heads,
nesting depth, item count, no length larger than the bytes left), so
``cbor2.loads`` never sees a tag, a map or a length it would allocate blindly;
then it checks every decoded value against the schema and the size limits of
:class:`~topics.PubSubConfig`.  Any deviation raises :class:`WireError`, and
nothing else: a packet that passes carries sizes the core accepts.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from itertools import pairwise
from typing import Any, Final

import cbor2

from causal import MsgId
from p2p._errors import P2PError
from topics import (
    Ack,
    Bound,
    Bundle,
    Fence,
    Packet,
    PubMessage,
    PubRound,
    PubSubConfig,
    RoundId,
    Sub,
    Uns,
    ViewEntry,
)
from vcube import Probe, Push, RemoteDetectorError, Reply, decode_detector
from vcube import encode_detector as _detector_tree

__all__ = [
    "PROTOCOL_VERSION",
    "Body",
    "Control",
    "FrameReader",
    "Leave",
    "Members",
    "MAX_REPLAY_DEPS",
    "MAX_REPLAY_ENTRIES",
    "MAX_REPLAY_PARTS",
    "Replay",
    "ReplayEntry",
    "Resume",
    "Revoked",
    "decode_body",
    "PeerExchange",
    "decode_frame",
    "WireError",
    "WireLimits",
    "decode_packets",
    "encode_packets",
    "frame",
    "uint_size",
]

PROTOCOL_VERSION: Final = 2
"""Version of the body layout; a peer speaking another version is refused.
(2: the optional *alive* element, the sender's detector version.)"""

PREFIX_BYTES: Final = 4
"""Bytes of the big-endian length prefix of a frame."""

NODE_LIMIT: Final = 1 << 64
"""Node ids are unsigned 64-bit integers."""

COUNTER_LIMIT: Final = 1 << 63
"""Incarnations, round numbers and sequence numbers are below this."""

MAX_DEPTH: Final = 7
"""Deepest array nesting of a valid body: body, packets, packet, messages, message, deps, id."""

_PUB, _SUB, _UNS, _ACK, _DET, _LEAVE, _MEMBERS, _REVOKED = 0, 1, 2, 3, 4, 5, 6, 7
_FENCE = 8
_RESUME, _REPLAY = 9, 10
_CONTROL_TAGS = (_DET, _LEAVE, _MEMBERS, _REVOKED, _RESUME, _REPLAY)


class WireError(P2PError):
    """A frame breaks the wire format or its limits; the connection that sent it is closed."""


_CORE = PubSubConfig()
"""The core's default limits: the wire's defaults for the same bounds."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WireLimits:
    """Bounds on what one received frame may hold.  The core's bounds default to
    :class:`PubSubConfig`'s (one source, ``_CORE``); :meth:`from_config` takes
    them from a node's own config."""

    max_frame: int = 4 * 1024 * 1024
    """Largest frame body, in bytes (checked on the length prefix, before buffering)."""

    max_items: int = 1 << 20
    """Most CBOR data items in one body (bounds the objects a body decodes to)."""

    max_packets: int = 4096
    """Most packets in one frame (a bundle counts its packets)."""

    max_topic_len: int = _CORE.max_topic_len
    """Longest topic name, in UTF-8 bytes."""

    max_payload: int = _CORE.max_payload
    """Largest publication payload, in bytes."""

    max_round_messages: int = _CORE.max_round_messages
    """Most publications in one PUB round."""

    max_round_bytes: int = _CORE.max_round_bytes
    """Most payload bytes in a PUB round of more than one publication."""

    max_barrier: int = _CORE.max_barrier
    """Most entries (``deps`` plus ``op_deps``) in one causal barrier."""

    max_view_entries: int = _CORE.max_view_entries
    """Most view entries, and most bounds, in one ACK."""

    max_dests: int = _CORE.max_view_entries
    """Most node ids in the ``dests`` route of a PUB or UNS."""

    max_records: int = 1024
    """Most discovery records in one peer exchange."""

    max_record: int = 1200
    """Largest discovery record, in bytes (``p2p._secure.MAX_DISCOVERY_SIZE``)."""

    max_detector_entries: int = 4096
    """Most entries in one failure-detector reply or push (``vcube.DetectorConfig.max_entries``)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"{f.name} must be a positive int, got {value!r}")
        if self.max_frame >= 1 << (8 * PREFIX_BYTES):
            raise ValueError(f"max_frame must fit the {PREFIX_BYTES}-byte length prefix")

    @classmethod
    def from_config(cls, config: PubSubConfig, *, max_frame: int = 4 * 1024 * 1024) -> WireLimits:
        """The limits a node running ``config`` applies to what it receives."""
        return cls(
            max_frame=max_frame,
            max_items=max(max_frame // 4, 1),
            max_topic_len=config.max_topic_len,
            max_payload=config.max_payload,
            max_round_messages=config.max_round_messages,
            max_round_bytes=config.max_round_bytes,
            max_barrier=config.max_barrier,
            max_view_entries=config.max_view_entries,
            max_dests=config.max_view_entries,
        )


# ------------------------------------------------------------------ encoding
#
# Bodies are written here byte by byte instead of by ``cbor2.dumps`` on a tree
# of lists: the same canonical CBOR (shortest heads, definite lengths), several
# times faster, since cbor2's encoder makes a Python-level ``write`` per item.
# A value the core never puts in a packet (a bool or a bignum where an int
# belongs, a bytearray payload) is handed to ``cbor2.dumps``, so the bytes are
# cbor2's in every case (``tests/test_wire.py`` compares the two).


def _head(major: int, n: int) -> bytes:
    """The shortest CBOR head of type ``major`` (0x00, 0x20, ... 0x80) with argument ``n``."""
    if n < 24:
        return bytes((major | n,))
    if n < 0x100:
        return bytes((major | 24, n))
    if n < 0x10000:
        return bytes((major | 25, n >> 8, n & 0xFF))
    if n < 0x1_0000_0000:
        return bytes((major | 26,)) + n.to_bytes(4, "big")
    return bytes((major | 27,)) + n.to_bytes(8, "big")


_UINT: Final = tuple(_head(0x00, n) for n in range(256))
_BYTES_HEAD: Final = tuple(_head(0x40, n) for n in range(256))
_ARRAY_HEAD: Final = tuple(_head(0x80, n) for n in range(256))


def _e_int(v: object) -> bytes:
    if type(v) is int:
        if 0 <= v < 0x100:
            return _UINT[v]
        if 0 <= v < NODE_LIMIT:
            return _head(0x00, v)
        if -NODE_LIMIT <= v < 0:
            return _head(0x20, -1 - v)
    return cbor2.dumps(v)


def _e_joins(v: int) -> bytes:
    """A message's ``op_joins``: an unsigned integer below 2**64, above that (a
    publication naming 64 ops or more) its big-endian bytes, shortest form:
    the wire format has no bignum tags."""
    if type(v) is int and v >= NODE_LIMIT:
        return _e_bytes(v.to_bytes((v.bit_length() + 7) // 8, "big"))
    return _e_int(v)


def _e_array(n: int) -> bytes:
    return _ARRAY_HEAD[n] if n < 0x100 else _head(0x80, n)


def _e_bytes(v: object) -> bytes:
    if type(v) is bytes:
        n = len(v)
        return (_BYTES_HEAD[n] if n < 0x100 else _head(0x40, n)) + v
    return cbor2.dumps(v)


def _e_bool(v: object) -> bytes:
    if v is True:
        return b"\xf5"
    if v is False:
        return b"\xf4"
    return cbor2.dumps(v)


_TOPICS: dict[str, bytes] = {}
"""Encoded topic names (a node uses few; cleared when it holds :data:`_CACHE_TOPICS`)."""

_CACHE_TOPICS: Final = 1024


def _e_topic(v: object) -> bytes:
    if type(v) is not str:
        return cbor2.dumps(v)
    data = _TOPICS.get(v)
    if data is None:
        try:
            raw = v.encode()
        except UnicodeEncodeError:  # a lone surrogate: cbor2 raises as it always did
            return cbor2.dumps(v)
        if len(_TOPICS) >= _CACHE_TOPICS:
            _TOPICS.clear()
        data = _TOPICS[v] = _head(0x60, len(raw)) + raw
    return data


def _e_id(i: MsgId) -> bytes:
    return b"\x83" + _e_int(i.source) + _e_int(i.incarnation) + _e_int(i.seq)


def _e_round(r: RoundId) -> bytes:
    return b"\x83" + _e_int(r.source) + _e_int(r.incarnation) + _e_int(r.number)


def _e_op(e: ViewEntry) -> bytes:
    return b"\x84" + _e_int(e.node) + _e_int(e.incarnation) + _e_int(e.rc) + _e_bool(e.subscribed)


def _e_ints(values: Sequence[int]) -> bytes:
    return _e_array(len(values)) + b"".join(map(_e_int, values))


_UNSET: Final = object()


def _e_messages(messages: Sequence[PubMessage]) -> bytes:
    """The CBOR array of a round's publications.

    Ids mostly share their source and incarnation (the very same int objects:
    the core's, or the decoder's), so their encoding is kept while they do.
    """
    out = [_e_array(len(messages))]
    append = out.append
    source: object = _UNSET
    incarnation: object = _UNSET
    prefix = b""

    def e_id(i: MsgId) -> None:
        nonlocal source, incarnation, prefix
        s, inc, seq = i
        if s is not source or inc is not incarnation:
            source, incarnation = s, inc
            prefix = b"\x83" + _e_int(s) + _e_int(inc)
        append(prefix)
        append(_UINT[seq] if type(seq) is int and 0 <= seq < 0x100 else _e_int(seq))

    for m in messages:
        joins = m.op_joins
        append(b"\x86" if joins else b"\x85")
        e_id(m.id)
        payload = m.payload
        if type(payload) is bytes and len(payload) < 0x100:
            append(_BYTES_HEAD[len(payload)])
            append(payload)
        else:
            append(_e_bytes(payload))
        deps = m.deps
        append(_e_array(len(deps)))
        for i in deps:
            e_id(i)
        op_deps = m.op_deps
        append(_e_array(len(op_deps)))
        for i in op_deps:
            e_id(i)
        append(_e_int(m.prev))
        if joins:
            append(_e_joins(joins))
    return b"".join(out)


_ENCODED: dict[int, tuple[tuple[PubMessage, ...], bytes]] = {}
"""The CBOR of recent rounds' ``messages``, by identity of the tuple (which it keeps alive).

A round goes to each child with the same ``messages`` and another ``dests``,
and a relay forwards the ``messages`` it decoded: both are encoded once (a
relay not at all: :func:`decode_frame` files the bytes it read).  Valid
because the tuple and what it holds are immutable and the encoding is
canonical: the bytes filed are those :func:`_e_messages` would write.
"""

_CACHE_ROUNDS: Final = 8


def _remember(messages: tuple[PubMessage, ...], data: bytes) -> None:
    _ENCODED[id(messages)] = (messages, data)
    excess = len(_ENCODED) - _CACHE_ROUNDS
    if excess > 0:  # the oldest go (insertion order); list() is atomic, for threads
        for key in list(_ENCODED)[:excess]:
            _ENCODED.pop(key, None)


def _messages_cbor(messages: tuple[PubMessage, ...]) -> bytes:
    hit = _ENCODED.get(id(messages))
    if hit is not None and hit[0] is messages:
        return hit[1]
    data = _e_messages(messages)
    _remember(messages, data)
    return data


def _e_packet(p: Packet) -> bytes:
    if isinstance(p, PubRound):
        return (
            b"\x85\x00"
            + _e_round(p.round)
            + _e_topic(p.topic)
            + _messages_cbor(p.messages)
            + _e_ints(p.dests)
        )
    if isinstance(p, Sub):
        return b"\x84\x01" + _e_round(p.round) + _e_topic(p.topic) + _e_op(p.op)
    if isinstance(p, Uns):
        return (
            _e_head(p.predates, p.beyond, 2)
            + _e_round(p.round)
            + _e_topic(p.topic)
            + _e_op(p.op)
            + _e_ints(p.dests)
            + _e_extras(p.predates, p.beyond)
        )
    if isinstance(p, Ack):
        return (
            _e_head(p.predates, p.beyond, 3)
            + _e_round(p.round)
            + _e_topic(p.topic)
            + _e_array(len(p.view))
            + b"".join(map(_e_op, p.view))
            + _e_bounds(p.bounds)
            + _e_extras(p.predates, p.beyond)
        )
    if isinstance(p, Fence):  # the stream's value is sent plus one: -1 is "none"
        src, inc, value = p.stream
        marks = b""
        if p.marks:  # an eighth element only when there are marks
            marks = _e_array(len(p.marks)) + b"".join(
                _e_id(MsgId(n, i, q + 1)) for n, i, q in p.marks
            )
        return (
            (b"\x88\x08" if marks else b"\x87\x08")
            + _e_round(p.round)
            + _e_topic(p.topic)
            + _e_id(MsgId(src, inc, value + 1))
            + _e_int(p.step)
            + _e_messages(p.messages)
            + _e_messages(p.others)
            + marks
        )
    raise TypeError(f"not a packet: {type(p).__name__}")


def _e_bounds(bounds: tuple[Bound, ...]) -> bytes:
    return _e_array(len(bounds)) + b"".join(
        b"\x83" + _e_int(b.node) + _e_int(b.incarnation) + _e_int(b.first_owned) for b in bounds
    )


@dataclass(frozen=True, slots=True)
class PeerExchange:
    """Signed discovery records passed between members (peer exchange).

    ``reply`` asks the receiver to answer with the records it knows.  The
    records are unverified bytes until the receiver's ``verify_record`` says
    otherwise.
    """

    records: tuple[bytes, ...]
    reply: bool = False


@dataclass(frozen=True, slots=True)
class Leave:
    """The sender's ``incarnation`` leaves the fleet gracefully: forget it, suspect nothing."""

    incarnation: int


@dataclass(frozen=True, slots=True)
class Members:
    """A digest of the membership records the sender holds (anti-entropy,
    ``p2p._membership``): a receiver holding a different set answers with its
    records, so one-way discovery heals in both directions.  ``revocations``
    is the serial of the fleet revocation list the sender holds (0: none): a
    receiver holding a newer one sends it (``p2p._revocation``)."""

    digest: int
    revocations: int = 0


@dataclass(frozen=True, slots=True)
class Revoked:
    """The fleet's signed revocation list, as bytes (checked by the receiver)."""

    blob: bytes


MAX_REVOKED_BLOB = 64 * 1024
"""Largest revocation list a REVOKED packet may carry."""


@dataclass(frozen=True, slots=True)
class Resume:
    """The sender, a subscriber of ``topic``, delivered the receiver's publications
    on it up to ``(epoch, ordinal)`` (``p2p.machine._frontier``): it asks for
    what the receiver published after that and still holds."""

    topic: str
    epoch: int
    ordinal: int


@dataclass(frozen=True, slots=True)
class Replay:
    """Part ``part`` of ``parts`` of the answer to the :class:`Resume` for what
    came after ``(epoch, ordinal)`` on ``topic``: publications the sender
    made, oldest first, each as ``(incarnation, seq, payload, deps)`` (its
    id is the sender's; the payload starts with its envelope; ``deps``:
    ``(source, epoch, ordinal)`` of what it causally follows)."""

    topic: str
    epoch: int
    ordinal: int
    part: int
    parts: int
    entries: tuple[ReplayEntry, ...]


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
        parts = [b"\x87", _e_int(_REPLAY), _e_topic(c.topic), _e_int(c.epoch), _e_int(c.ordinal)]
        parts += (_e_int(c.part), _e_int(c.parts), _e_array(len(c.entries)))
        for inc, seq, payload, deps in c.entries:
            parts += (b"\x84", _e_int(inc), _e_int(seq), _e_bytes(payload), _e_array(len(deps)))
            parts += (b"\x83" + _e_int(n) + _e_int(e) + _e_int(o) for n, e, o in deps)
        return b"".join(parts)
    return b"\x82" + _e_int(_DET) + cbor2.dumps(_detector_tree(c))


def encode_packets(
    packets: Sequence[Packet | Bundle],
    exchange: PeerExchange | None = None,
    control: Sequence[Control] = (),
    alive: int | None = None,
) -> bytes:
    """One frame body: the protocol version and ``packets``, bundles flattened in order,
    then the ``control`` packets, then ``alive`` (the sender's detector version)
    and ``exchange`` if given.

    The packets come from the local core and are trusted; :func:`decode_frame`
    is where the receiver checks them.
    """
    parts: list[bytes] = []
    for p in packets:
        if isinstance(p, Bundle):
            parts.extend(map(_e_packet, p.packets))
        else:
            parts.append(_e_packet(p))
    parts.extend(map(_e_control, control))
    body = [
        _e_array(2 + (alive is not None) + (exchange is not None)),
        _e_int(PROTOCOL_VERSION),
        _e_array(len(parts)),
    ]
    body += parts
    if alive is not None:
        body.append(_e_int(alive))
    if exchange is not None:
        records = exchange.records
        body += (b"\x82", _e_bool(exchange.reply), _e_array(len(records)))
        body += map(_e_bytes, records)
    return b"".join(body)


def uint_size(v: int) -> int:
    """Bytes of the shortest CBOR encoding of the unsigned integer ``v`` (what an
    *alive* element adds to a body)."""
    return len(_e_int(v))


def frame(body: bytes) -> bytes:
    """``body`` behind its 4-byte big-endian length prefix."""
    if len(body) >= 1 << (8 * PREFIX_BYTES):
        raise WireError(f"frame body of {len(body)} bytes does not fit the length prefix")
    return len(body).to_bytes(PREFIX_BYTES, "big") + body


# ------------------------------------------------------------------ decoding
#
# Two decoders.  The *checked* one (:func:`_decode_tree`) is the reference:
# it scans the raw bytes, lets ``cbor2`` build the tree, checks every value
# against the schema, and its errors say what is wrong.  The *direct* one
# (:func:`_decode_direct`) reads the frames the runtime exchanges all the time
# (PUB rounds and plain ACKs, no peer exchange) from the bytes straight into
# packets, in one pass, by the same rules (shortest heads, types, ranges,
# sizes, item count, no trailing bytes); on anything else, or anything wrong,
# it gives up and the checked decoder decides.  So the direct decoder only
# ever accepts a body the checked one accepts, with the same packets
# (``tests/test_wire.py`` runs both on every fuzzed body), and every error
# comes from the checked one.


class _GiveUpError(Exception):
    """The direct decoder leaves this body to the checked one."""


_U16: Final = struct.Struct(">H").unpack_from
_U32: Final = struct.Struct(">I").unpack_from
_U64: Final = struct.Struct(">Q").unpack_from


def _arg(b: bytes, p: int, major: int) -> tuple[int, int]:
    """The argument of the head at ``b[p]`` if it has type ``major`` and its shortest
    form, and the position after the head; :class:`_GiveUpError` otherwise.

    A head cut short by the end of ``b`` raises ``IndexError`` or ``struct.error``.
    """
    info = b[p] - major
    if 0 <= info < 24:
        return info, p + 1
    if info == 24:
        v = b[p + 1]
        if v >= 24:
            return v, p + 2
    elif info == 25:
        (v,) = _U16(b, p + 1)
        if v >= 0x100:
            return v, p + 3
    elif info == 26:
        (v,) = _U32(b, p + 1)
        if v >= 0x10000:
            return v, p + 5
    elif info == 27:
        (v,) = _U64(b, p + 1)
        if v >= 0x1_0000_0000:
            return v, p + 9
    raise _GiveUpError


def _ctr_at(b: bytes, p: int) -> tuple[int, int]:
    v, p = _arg(b, p, 0x00)
    if v >= COUNTER_LIMIT:
        raise _GiveUpError
    return v, p


_new_tuple = tuple.__new__


_MessageMaker = Callable[[MsgId, bytes, tuple[MsgId, ...], tuple[MsgId, ...], int, int], PubMessage]


def _message_maker() -> _MessageMaker:
    """A constructor of :class:`PubMessage` without the frozen dataclass' ``__init__``
    (an ``object.__setattr__`` per field): it fills the slots directly.  Falls
    back to the class itself if its layout is not the one this code knows."""
    names = ("id", "payload", "deps", "op_deps", "prev", "op_joins", "_dep_set")
    if (
        tuple(f.name for f in fields(PubMessage)) != names
        or getattr(PubMessage, "__slots__", ()) != names
        or hasattr(PubMessage, "__post_init__")
    ):
        return PubMessage
    set_id, set_payload, set_deps, set_op_deps, set_prev, set_joins, set_dep_set = (
        vars(PubMessage)[n].__set__ for n in names
    )
    new = object.__new__

    def make(
        mid: MsgId,
        payload: bytes,
        deps: tuple[MsgId, ...],
        op_deps: tuple[MsgId, ...],
        prev: int,
        joins: int,
    ) -> PubMessage:
        m: PubMessage = new(PubMessage)
        set_id(m, mid)
        set_payload(m, payload)
        set_deps(m, deps)
        set_op_deps(m, op_deps)
        set_prev(m, prev)
        set_joins(m, joins)
        set_dep_set(m, None)
        return m

    return make


_new_message: Final = _message_maker()

_TOPIC_NAMES: dict[bytes, str] = {}
"""Decoded topic names by their UTF-8 bytes (cleared when it holds :data:`_CACHE_TOPICS`)."""


def _id_at(b: bytes, p: int, last: list[Any]) -> tuple[MsgId, int]:
    """The id at ``b[p]``.  ``last`` is ``[head, source, incarnation]`` of the previous
    id read: ids of a round mostly share them, and the bytes ``head`` (array
    head, source, incarnation) were already checked, so they are not read again."""
    head = last[0]
    if head and b.startswith(head, p):
        p += len(head)
        source, incarnation = last[1], last[2]
    else:
        if b[p] != 0x83:
            raise _GiveUpError
        source, q = _arg(b, p + 1, 0x00)
        incarnation, q = _ctr_at(b, q)
        last[:] = (b[p:q], source, incarnation)
        p = q
    h = b[p]  # the sequence number, its usual heads inline
    if h < 24:
        seq = h
        p += 1
    elif h == 0x19:
        (seq,) = _U16(b, p + 1)
        if seq < 0x100:
            raise _GiveUpError
        p += 3
    else:
        seq, p = _ctr_at(b, p)
    return _new_tuple(MsgId, (source, incarnation, seq)), p


def _ids_at(b: bytes, p: int, last: list[Any], limit: int) -> tuple[tuple[MsgId, ...], int]:
    h = b[p]
    if h == 0x80:
        return (), p + 1
    if h == 0x81:
        mid, p = _id_at(b, p + 1, last)
        return (mid,), p
    n, p = _arg(b, p, 0x80)
    if n > limit:
        raise _GiveUpError
    ids = []
    for _ in range(n):
        mid, p = _id_at(b, p, last)
        ids.append(mid)
    return tuple(ids), p


def _messages_at(
    b: bytes, p: int, lim: WireLimits, budget: int
) -> tuple[tuple[PubMessage, ...], int, int]:
    """A PUB's messages array at ``b[p]``: the messages, the position after them and
    their CBOR item count, at most ``budget`` (checked as it goes, so that no more
    objects are built than ``max_items`` allows)."""
    n, p = _arg(b, p, 0x80)
    if n > lim.max_round_messages:
        raise _GiveUpError
    max_payload, max_barrier = lim.max_payload, lim.max_barrier
    last: list[Any] = [b"", 0, 0]
    messages = []
    items = total = 0
    make = _new_message
    id_at = _id_at
    for _ in range(n):
        head = b[p]
        if head != 0x85 and head != 0x86:
            raise _GiveUpError
        mid, p = id_at(b, p + 1, last)
        h = b[p]
        if 0x40 <= h < 0x58:
            size = h - 0x40
            p += 1
        elif h == 0x58:
            size = b[p + 1]
            if size < 24:
                raise _GiveUpError
            p += 2
        else:
            size, p = _arg(b, p, 0x40)
        if size > max_payload:
            raise _GiveUpError
        payload = b[p : p + size]
        p += size
        h = b[p]
        if h == 0x81:
            dep, p = id_at(b, p + 1, last)
            deps: tuple[MsgId, ...] = (dep,)
        else:
            deps, p = _ids_at(b, p, last, max_barrier)
        if b[p] == 0x80:
            op_deps: tuple[MsgId, ...] = ()
            p += 1
        else:
            op_deps, p = _ids_at(b, p, last, max_barrier)
        barrier = len(deps) + len(op_deps)
        if barrier > max_barrier:
            raise _GiveUpError
        h = b[p]
        if h == 0x20:
            prev = -1
            p += 1
        elif h == 0x19:
            (prev,) = _U16(b, p + 1)
            if prev < 0x100:
                raise _GiveUpError
            p += 3
        else:
            prev, p = _ctr_at(b, p)
        joins = 0
        if head == 0x86:
            joins, p = _arg(b, p, 0x00)
            if not 0 < joins < 1 << len(op_deps):
                raise _GiveUpError
        items += 9 + 4 * barrier + (head - 0x85)  # a joins item with 0x86
        if items > budget:
            raise _GiveUpError
        messages.append(make(mid, payload, deps, op_deps, prev, joins))
        total += size
    if n > 1 and total > lim.max_round_bytes:
        raise _GiveUpError
    return tuple(messages), p, items


def _round_at(b: bytes, p: int) -> tuple[RoundId, int]:
    if b[p] != 0x83:
        raise _GiveUpError
    source, p = _arg(b, p + 1, 0x00)
    incarnation, p = _ctr_at(b, p)
    number, p = _ctr_at(b, p)
    return RoundId(source, incarnation, number), p


def _topic_at(b: bytes, p: int, lim: WireLimits) -> tuple[str, int]:
    size, p = _arg(b, p, 0x60)
    if not 0 < size <= lim.max_topic_len:
        raise _GiveUpError
    raw = b[p : p + size]
    topic = _TOPIC_NAMES.get(raw)
    if topic is None:
        topic = raw.decode()  # strict UTF-8, as cbor2's; an error means: give up
        if len(_TOPIC_NAMES) >= _CACHE_TOPICS:
            _TOPIC_NAMES.clear()
        _TOPIC_NAMES[raw] = topic
    return topic, p + size


def _dests_at(b: bytes, p: int, lim: WireLimits) -> tuple[tuple[int, ...], int]:
    n, p = _arg(b, p, 0x80)
    if n > lim.max_dests:
        raise _GiveUpError
    dests = []
    before = -1
    for _ in range(n):
        node, p = _arg(b, p, 0x00)
        if node <= before:
            raise _GiveUpError
        dests.append(node)
        before = node
    return tuple(dests), p


def _decode_direct(body: bytes, lim: WireLimits) -> Body | None:
    """The packets and *alive* of ``body`` if it holds only PUB rounds and plain ACKs
    (no view, no bounds) and no peer exchange, all valid; ``None``: leave it to
    the checked decoder."""
    if type(body) is not bytes:
        return None
    try:
        return _direct(body, lim)
    except Exception:  # _GiveUpError, a read past the end, bad UTF-8: the checked decoder decides
        return None


def _direct(b: bytes, lim: WireLimits) -> Body:
    # [version, packets] or [version, packets, alive]: no exchange
    if b[1] != PROTOCOL_VERSION or not 0x82 <= b[0] <= 0x83:
        raise _GiveUpError
    count, p = _arg(b, 2, 0x80)
    if not 0 < count <= lim.max_packets:
        raise _GiveUpError
    items = 3  # the body, the version, the packets array
    packets: list[Packet] = []
    spans = []
    for _ in range(count):
        if b[p] != 0x85:
            raise _GiveUpError
        tag = b[p + 1]
        rid, p = _round_at(b, p + 2)
        topic, p = _topic_at(b, p, lim)
        if tag == _PUB:
            start = p
            messages, p, msg_items = _messages_at(b, p, lim, lim.max_items - items)
            spans.append((messages, start, p))
            dests, p = _dests_at(b, p, lim)
            items += 9 + msg_items + len(dests)
            packets.append(PubRound(rid, topic, messages, dests))
        elif tag == _ACK and b[p] == 0x80 and b[p + 1] == 0x80:  # no view, no bounds
            p += 2
            items += 9
            packets.append(Ack(rid, topic))
        else:
            raise _GiveUpError
        if items > lim.max_items:
            raise _GiveUpError
    alive = None
    if b[0] == 0x83:
        alive, p = _arg(b, p, 0x00)
        items += 1
        if items > lim.max_items:
            raise _GiveUpError
    if p != len(b):
        raise _GiveUpError
    for messages, start, stop in spans:  # a relay forwards them as they came
        _remember(messages, b[start:stop])
    return Body(packets, alive=alive)


def _scan(body: bytes, max_items: int) -> None:
    """Check that ``body`` is exactly one CBOR item of the wire subset (see the module doc).

    Cheap: strings are skipped by their length, so the cost is per item, not per
    byte.  Every declared length is checked against the bytes left, so no
    length is ever trusted before it is known to be there.
    """
    end = len(body)
    pos = 0
    items = 0
    left = 1  # items still to read in the innermost open array (top level: the body)
    stack: list[int] = []
    while True:
        if left == 0:
            if not stack:
                break
            left = stack.pop()
            continue
        if pos >= end:
            raise WireError(f"body truncated at byte {pos}")
        head = body[pos]
        pos += 1
        left -= 1
        items += 1
        if items > max_items:
            raise WireError(f"body holds more than max_items={max_items} CBOR items")
        major, info = head >> 5, head & 0x1F
        if major == 7:
            if info not in (20, 21):
                raise WireError(f"CBOR simple/float item 0x{head:02x} at byte {pos - 1}")
            continue
        if major > 4:
            kind = "map" if major == 5 else "tag"
            raise WireError(f"CBOR {kind} at byte {pos - 1} (not used by the wire format)")
        if info < 24:
            arg = info
        elif info <= 27:
            width = 1 << (info - 24)
            if pos + width > end:
                raise WireError(f"body truncated at byte {pos}")
            arg = int.from_bytes(body[pos : pos + width], "big")
            pos += width
            if arg < (24 if width == 1 else 1 << (4 * width)):
                raise WireError(f"CBOR head at byte {pos - width - 1} is not in its shortest form")
        else:
            raise WireError(
                f"indefinite-length or reserved CBOR item 0x{head:02x} at byte {pos - 1}"
            )
        if major <= 1:
            continue
        if arg > end - pos:  # strings: their bytes; arrays: at least one byte per item
            raise WireError(f"length {arg} at byte {pos} exceeds the {end - pos} bytes left")
        if major < 4:
            pos += arg
            continue
        if len(stack) >= MAX_DEPTH:
            raise WireError(f"arrays nested deeper than {MAX_DEPTH}")
        stack.append(left)
        left = arg
    if pos != end:
        raise WireError(f"{end - pos} trailing bytes after the body")


_HEADS = {tag: (bytes((0x85, tag)), bytes((0x86, tag)), bytes((0x87, tag))) for tag in (2, 3)}
"""Per UNS/ACK tag, the array heads of 5, 6 and 7 elements, built once: an ACK is
encoded for every round on every hop."""


def _e_head(predates: tuple[Bound, ...], beyond: tuple[Bound, ...], tag: int) -> bytes:
    """An ACK's or UNS's array head: 5 elements, 6 with ``predates``, 7 with ``beyond``."""
    return _HEADS[tag][2 if beyond else 1 if predates else 0]


def _e_extras(predates: tuple[Bound, ...], beyond: tuple[Bound, ...]) -> bytes:
    if beyond:
        return _e_bounds(predates) + _e_bounds(beyond)
    return _e_bounds(predates) if predates else b""


def _d_extras(
    fields: list[object], what: str, limit: int
) -> tuple[tuple[Bound, ...], tuple[Bound, ...]]:
    """The optional sixth and seventh elements of an ACK or UNS (``predates``,
    ``beyond``): each left out when it and what follows are empty, so that
    every packet has one encoding (an empty last element is refused)."""
    if len(fields) == 5:
        return (), ()
    predates = _d_bounds(fields[5], what + ".predates", limit)
    if len(fields) == 6:
        if not predates:
            raise WireError(f"{what}.predates: empty (the 5-element form is the encoding)")
        return predates, ()
    beyond = _d_bounds(fields[6], what + ".beyond", limit)
    if not beyond:
        raise WireError(f"{what}.beyond: empty (the 6-element form is the encoding)")
    return predates, beyond


def _extras_size(raw: object) -> int:
    """How many elements an ACK or UNS array may have: 5, 6 or 7 (checked by ``_array``)."""
    return len(raw) if type(raw) is list and len(raw) in (6, 7) else 5


def _d_bounds(raw: object, what: str, limit: int) -> tuple[Bound, ...]:
    out = []
    for b in _array(raw, what, limit=limit):
        node, inc, first = _array(b, what + "[]", 3)
        out.append(
            Bound(
                _node(node, "bound.node"),
                _ctr(inc, "bound.incarnation"),
                _ctr(first, "bound.first_owned"),
            )
        )
    return tuple(out)


def _array(v: object, what: str, size: int | None = None, limit: int | None = None) -> list[object]:
    if type(v) is not list:
        raise WireError(f"{what}: expected an array, got {type(v).__name__}")
    if size is not None and len(v) != size:
        raise WireError(f"{what}: expected {size} elements, got {len(v)}")
    if limit is not None and len(v) > limit:
        raise WireError(f"{what}: {len(v)} elements exceed the limit of {limit}")
    return v


def _int(v: object, what: str, lo: int, hi: int) -> int:
    if type(v) is not int:  # also rejects bool, a subclass of int
        raise WireError(f"{what}: expected an integer, got {type(v).__name__}")
    if not lo <= v < hi:
        raise WireError(f"{what}: {v} is outside [{lo}, {hi})")
    return v


def _node(v: object, what: str) -> int:
    return _int(v, what, 0, NODE_LIMIT)


def _ctr(v: object, what: str) -> int:
    return _int(v, what, 0, COUNTER_LIMIT)


def _d_round(v: object) -> RoundId:
    s, i, n = _array(v, "round", 3)
    return RoundId(_node(s, "round.source"), _ctr(i, "round.incarnation"), _ctr(n, "round.number"))


def _d_topic(v: object, lim: WireLimits) -> str:
    if type(v) is not str:
        raise WireError(f"topic: expected a text string, got {type(v).__name__}")
    size = len(v.encode())
    if not 0 < size <= lim.max_topic_len:
        raise WireError(
            f"topic: {size} UTF-8 bytes, outside [1, max_topic_len={lim.max_topic_len}]"
        )
    return v


def _d_id(v: object, what: str) -> MsgId:
    s, i, q = _array(v, what, 3)
    return MsgId(_node(s, what + ".source"), _ctr(i, what + ".incarnation"), _ctr(q, what + ".seq"))


def _d_op(v: object, what: str) -> ViewEntry:
    n, i, rc, sub = _array(v, what, 4)
    if type(sub) is not bool:
        raise WireError(f"{what}.subscribed: expected a bool, got {type(sub).__name__}")
    return ViewEntry(
        _node(n, what + ".node"), _ctr(i, what + ".incarnation"), _ctr(rc, what + ".rc"), sub
    )


def _d_dests(v: object, lim: WireLimits) -> tuple[int, ...]:
    raw = _array(v, "dests", limit=lim.max_dests)
    dests = tuple(_node(d, "dests[]") for d in raw)
    for a, b in pairwise(dests):
        if a >= b:
            raise WireError(f"dests: not strictly increasing ({a} then {b})")
    return dests


def _d_message(v: object, lim: WireLimits) -> PubMessage:
    fields = _array(v, "message")
    if len(fields) not in (5, 6):
        raise WireError(f"message: expected 5 or 6 elements, got {len(fields)}")
    mid, payload, deps, op_deps, prev = fields[:5]
    msg_id = _d_id(mid, "message.id")
    if type(payload) is not bytes:
        raise WireError(f"message.payload: expected a byte string, got {type(payload).__name__}")
    if len(payload) > lim.max_payload:
        raise WireError(
            f"message.payload: {len(payload)} bytes exceed max_payload={lim.max_payload}"
        )
    d = _array(deps, "message.deps")
    o = _array(op_deps, "message.op_deps")
    if len(d) + len(o) > lim.max_barrier:
        raise WireError(
            f"message: barrier of {len(d) + len(o)} exceeds max_barrier={lim.max_barrier}"
        )
    return PubMessage(
        msg_id,
        payload,
        tuple(_d_id(x, "message.deps[]") for x in d),
        tuple(_d_id(x, "message.op_deps[]") for x in o),
        _int(prev, "message.prev", -1, COUNTER_LIMIT),
        _joins(fields[5], len(o)) if len(fields) == 6 else 0,
    )


def _joins(v: object, ops: int) -> int:
    """``op_joins`` read back (:func:`_e_joins`): 1 .. 2**ops - 1, as an integer
    below 2**64 or as the shortest big-endian bytes of one at or above it."""
    if type(v) is bytes:
        if not v or v[0] == 0:
            raise WireError("message.joins: bytes not in their shortest form")
        value = int.from_bytes(v, "big")
        if value < NODE_LIMIT:
            raise WireError("message.joins: bytes for a value that fits an integer")
        return _int(value, "message.joins", 1, 1 << ops)
    return _int(v, "message.joins", 1, 1 << ops)


def _d_packet(v: object, lim: WireLimits) -> Packet:
    raw = _array(v, "packet")
    if not raw:
        raise WireError("packet: empty array")
    tag = raw[0]
    if type(tag) is not int:
        raise WireError(f"packet: type tag must be an integer, got {type(tag).__name__}")
    if tag == _PUB:
        _, rid, topic, msgs, dests = _array(raw, "PUB", 5)
        messages = tuple(
            _d_message(m, lim) for m in _array(msgs, "PUB.messages", limit=lim.max_round_messages)
        )
        total = sum(len(m.payload) for m in messages)
        if len(messages) > 1 and total > lim.max_round_bytes:
            raise WireError(
                f"PUB: {total} payload bytes exceed max_round_bytes={lim.max_round_bytes}"
            )
        return PubRound(_d_round(rid), _d_topic(topic, lim), messages, _d_dests(dests, lim))
    if tag == _SUB:
        _, rid, topic, op = _array(raw, "SUB", 4)
        return Sub(_d_round(rid), _d_topic(topic, lim), _d_op(op, "SUB.op"))
    if tag == _UNS:
        fields = _array(raw, "UNS", _extras_size(raw))
        rid, topic, op, dests = fields[1:5]
        predates, beyond = _d_extras(fields, "UNS", lim.max_view_entries)
        return Uns(
            _d_round(rid),
            _d_topic(topic, lim),
            _d_op(op, "UNS.op"),
            _d_dests(dests, lim),
            predates,
            beyond,
        )
    if tag == _ACK:
        fields = _array(raw, "ACK", _extras_size(raw))
        rid, topic, view, bounds = fields[1:5]
        n = lim.max_view_entries
        entries = tuple(_d_op(e, "ACK.view[]") for e in _array(view, "ACK.view", limit=n))
        predates, beyond = _d_extras(fields, "ACK", n)
        bnds = _d_bounds(bounds, "ACK.bounds", n)
        return Ack(_d_round(rid), _d_topic(topic, lim), entries, bnds, predates, beyond)
    if tag == _FENCE:
        return _d_fence(raw, lim)
    raise WireError(f"packet: unknown type tag {tag}")


def _d_fence(raw: list[object], lim: WireLimits) -> Fence:
    if len(raw) not in (7, 8):
        raise WireError(f"FENCE: expected 7 or 8 elements, got {len(raw)}")
    _, rid, topic, stream, step, msgs, others = raw[:7]
    src, inc, value = _d_id(stream, "FENCE.stream")
    marks: list[MsgId] = []
    if len(raw) == 8:
        for m in _array(raw[7], "FENCE.marks", limit=lim.max_view_entries):
            n, i, q = _d_id(m, "FENCE.marks[]")
            marks.append(MsgId(n, i, q - 1))
    limit = lim.max_round_messages
    return Fence(
        _d_round(rid),
        _d_topic(topic, lim),
        MsgId(src, inc, value - 1),
        _int(step, "FENCE.step", 0, 5),
        tuple(_d_message(m, lim) for m in _array(msgs, "FENCE.messages", limit=limit)),
        tuple(_d_message(m, lim) for m in _array(others, "FENCE.others", limit=limit)),
        tuple(marks),
    )


def decode_packets(body: bytes, limits: WireLimits) -> list[Packet]:
    """The packets of one frame body, in order; :class:`WireError` on any deviation
    (a body with a peer exchange included: see :func:`decode_frame`)."""
    packets, exchange = decode_frame(body, limits)
    if exchange is not None:
        raise WireError("unexpected peer exchange in a packets-only body")
    return packets


@dataclass(frozen=True, slots=True)
class Body:
    """A decoded frame body: core packets, control packets, a peer exchange and
    the sender's detector version (*alive*, ``None`` if the frame has none)."""

    packets: list[Packet]
    exchange: PeerExchange | None = None
    control: tuple[Control, ...] = ()
    alive: int | None = None


def decode_frame(body: bytes, limits: WireLimits) -> tuple[list[Packet], PeerExchange | None]:
    """The packets of one frame body, in order, and its peer exchange if any.

    Raises :class:`WireError` on any deviation, control packets included (see
    :func:`decode_body`); a body holds at least one packet or an exchange.
    """
    decoded = decode_body(body, limits)
    if decoded.control:
        raise WireError("unexpected control packet in a packets-only body")
    return decoded.packets, decoded.exchange


def decode_body(body: bytes, limits: WireLimits) -> Body:
    """Everything one frame body holds; :class:`WireError` on any deviation.

    Frames of PUB rounds and plain ACKs take the direct decoder; anything
    else (control packets included) the checked one, so a detector message
    is validated by the reference rules and ``vcube.decode_detector``.
    """
    if len(body) > limits.max_frame:
        raise WireError(f"body of {len(body)} bytes exceeds max_frame={limits.max_frame}")
    decoded = _decode_direct(body, limits)
    if decoded is not None:
        return decoded
    return _decode_tree(body, limits)


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
    _, topic, epoch, ordinal, part, parts, raw_entries = _array(raw, "REPLAY", 7)
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
    return Replay(_d_topic(topic, lim), epoch, ordinal, part, parts, tuple(entries))


def _decode_tree(body: bytes, limits: WireLimits) -> Body:
    """:func:`decode_body` by the reference rules: scan, ``cbor2``, schema checks."""
    _scan(body, limits.max_items)
    try:
        tree: object = cbor2.loads(body, allow_indefinite=False, max_depth=MAX_DEPTH + 1)
    except (cbor2.CBORDecodeError, ValueError) as exc:  # e.g. a text string that is not UTF-8
        raise WireError(f"undecodable body: {exc}") from None
    parts = _array(tree, "body")
    if len(parts) not in (2, 3, 4):
        raise WireError(f"body: expected 2 to 4 elements, got {len(parts)}")
    version = parts[0]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise WireError(
            f"unsupported protocol version {version!r} (this node speaks {PROTOCOL_VERSION})"
        )
    raw = _array(parts[1], "packets", limit=limits.max_packets)
    alive, exchange = _d_tail(parts[2:], limits)
    if not raw and exchange is None:
        raise WireError("frame without packets")
    packets: list[Packet] = []
    control: list[Control] = []
    for p in raw:
        if type(p) is list and p and p[0] in _CONTROL_TAGS and type(p[0]) is int:
            control.append(_d_control(p, limits))
        else:
            packets.append(_d_packet(p, limits))
    return Body(packets, exchange, tuple(control), alive)


def _d_tail(tail: list[object], lim: WireLimits) -> tuple[int | None, PeerExchange | None]:
    """*alive* and the exchange after the packets: ``[]``, ``[alive]``, ``[exchange]``
    or ``[alive, exchange]``."""
    alive = None
    if len(tail) == 2 or (tail and type(tail[0]) is not list):
        alive, tail = _node(tail[0], "alive"), tail[1:]
    return alive, _d_exchange(tail[0], lim) if tail else None


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


class FrameReader:
    """Incremental de-framing of one TCP stream, in bounded memory.

    Holds at most one incomplete frame (``PREFIX_BYTES + max_frame`` bytes).  A
    length prefix above ``max_frame`` (or of zero) raises :class:`WireError`
    as soon as its 4 bytes arrive, before anything is buffered for it; the
    reader then stays failed.
    """

    __slots__ = ("_buf", "_failed", "_max_frame", "_tight", "_tight_max")

    def __init__(self, limits: WireLimits, *, tight: int = 0, tight_max: int = 0) -> None:
        """``tight``: the first frames, limited to ``tight_max`` bytes each (a
        handshake, before the peer has proved anything), then ``max_frame``."""
        self._max_frame = limits.max_frame
        self._tight = tight
        self._tight_max = tight_max
        self._buf = bytearray()
        self._failed: WireError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for the frame being received."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data`` from the stream; return the frame bodies it completes, in order."""
        if self._failed is not None:
            raise self._failed
        out: list[bytes] = []
        buf = self._buf
        view = memoryview(data)
        while view:
            if len(buf) < PREFIX_BYTES:
                take = PREFIX_BYTES - len(buf)
                buf += view[:take]
                view = view[take:]
                if len(buf) < PREFIX_BYTES:
                    break
                size = int.from_bytes(buf, "big")
                limit = self._max_frame
                if self._tight:
                    self._tight -= 1
                    limit = self._tight_max
                if not 0 < size <= limit:
                    buf.clear()
                    self._failed = WireError(f"frame length {size} outside [1, max_frame={limit}]")
                    raise self._failed
            size = int.from_bytes(buf[:PREFIX_BYTES], "big")
            take = PREFIX_BYTES + size - len(buf)
            buf += view[:take]
            view = view[take:]
            if len(buf) == PREFIX_BYTES + size:
                out.append(bytes(buf[PREFIX_BYTES:]))
                buf.clear()
        return out

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
body     ``[version, [packet, ...]]``                          version == 1; 1..max_packets
         or ``[version, [packet, ...], exchange]``             0..max_packets
exchange ``[reply: bool, [record: bytes, ...]]``               1..max_records, each 1..
                                                               max_record bytes
PUB      ``[0, round, topic, [message, ...], dests]``          <= max_round_messages; payload
                                                               sum <= max_round_bytes (when
                                                               more than one message)
SUB      ``[1, round, topic, op]``
UNS      ``[2, round, topic, op, dests]``
ACK      ``[3, round, topic, [op, ...], [bound, ...]]``        each <= max_view_entries
round    ``[source: node, incarnation: ctr, number: ctr]``     ``RoundId``
op       ``[node: node, incarnation: ctr, rc: ctr, bool]``     ``ViewEntry`` (subscribed)
bound    ``[node: node, incarnation: ctr, first_owned: ctr]``  ``Bound``
message  ``[id, payload: bytes, [id, ...], [id, ...], prev]``  ``PubMessage``: payload <=
                                                               max_payload; deps + op_deps <=
                                                               max_barrier; prev: -1 or ctr
id       ``[source: node, incarnation: ctr, seq: ctr]``        ``causal.MsgId``
topic    text string                                           1..max_topic_len UTF-8 bytes
dests    ``[node, ...]``                                       strictly increasing; <=
                                                               max_dests
node     unsigned integer                                      < 2**64
ctr      unsigned integer                                      < 2**63
=======  ====================================================  ==============================

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

from collections.abc import Sequence
from dataclasses import dataclass, fields
from itertools import pairwise
from typing import Final

import cbor2

from causal import MsgId
from p2p._errors import P2PError
from topics import (
    Ack,
    Bound,
    Bundle,
    Packet,
    PubMessage,
    PubRound,
    PubSubConfig,
    RoundId,
    Sub,
    Uns,
    ViewEntry,
)

__all__ = [
    "PROTOCOL_VERSION",
    "FrameReader",
    "PeerExchange",
    "decode_frame",
    "WireError",
    "WireLimits",
    "decode_packets",
    "encode_packets",
    "frame",
]

PROTOCOL_VERSION: Final = 1
"""Version of the body layout; a peer speaking another version is refused."""

PREFIX_BYTES: Final = 4
"""Bytes of the big-endian length prefix of a frame."""

NODE_LIMIT: Final = 1 << 64
"""Node ids are unsigned 64-bit integers."""

COUNTER_LIMIT: Final = 1 << 63
"""Incarnations, round numbers and sequence numbers are below this."""

MAX_DEPTH: Final = 7
"""Deepest array nesting of a valid body: body, packets, packet, messages, message, deps, id."""

_PUB, _SUB, _UNS, _ACK = 0, 1, 2, 3


class WireError(P2PError):
    """A frame breaks the wire format or its limits; the connection that sent it is closed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WireLimits:
    """Bounds on what one received frame may hold.  Defaults match :class:`PubSubConfig`."""

    max_frame: int = 4 * 1024 * 1024
    """Largest frame body, in bytes (checked on the length prefix, before buffering)."""

    max_items: int = 1 << 20
    """Most CBOR data items in one body (bounds the objects a body decodes to)."""

    max_packets: int = 4096
    """Most packets in one frame (a bundle counts its packets)."""

    max_topic_len: int = 256
    """Longest topic name, in UTF-8 bytes."""

    max_payload: int = 64 * 1024
    """Largest publication payload, in bytes."""

    max_round_messages: int = 256
    """Most publications in one PUB round."""

    max_round_bytes: int = 512 * 1024
    """Most payload bytes in a PUB round of more than one publication."""

    max_barrier: int = 4096
    """Most entries (``deps`` plus ``op_deps``) in one causal barrier."""

    max_view_entries: int = 1 << 16
    """Most view entries, and most bounds, in one ACK."""

    max_dests: int = 1 << 16
    """Most node ids in the ``dests`` route of a PUB or UNS."""

    max_records: int = 1024
    """Most discovery records in one peer exchange."""

    max_record: int = 1200
    """Largest discovery record, in bytes (``p2p._secure.MAX_DISCOVERY_SIZE``)."""

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

_Cbor = int | bytes | str | bool | list["_Cbor"]


def _ids(ids: Sequence[MsgId]) -> list[_Cbor]:
    return [[i.source, i.incarnation, i.seq] for i in ids]


def _round(r: RoundId) -> list[_Cbor]:
    return [r.source, r.incarnation, r.number]


def _op(e: ViewEntry) -> list[_Cbor]:
    return [e.node, e.incarnation, e.rc, e.subscribed]


def _packet(p: Packet) -> list[_Cbor]:
    if isinstance(p, PubRound):
        msgs: list[_Cbor] = [
            [
                [m.id.source, m.id.incarnation, m.id.seq],
                m.payload,
                _ids(m.deps),
                _ids(m.op_deps),
                m.prev,
            ]
            for m in p.messages
        ]
        return [_PUB, _round(p.round), p.topic, msgs, list(p.dests)]
    if isinstance(p, Sub):
        return [_SUB, _round(p.round), p.topic, _op(p.op)]
    if isinstance(p, Uns):
        return [_UNS, _round(p.round), p.topic, _op(p.op), list(p.dests)]
    if isinstance(p, Ack):
        bounds: list[_Cbor] = [[b.node, b.incarnation, b.first_owned] for b in p.bounds]
        return [_ACK, _round(p.round), p.topic, [_op(e) for e in p.view], bounds]
    raise TypeError(f"not a packet: {type(p).__name__}")


@dataclass(frozen=True, slots=True)
class PeerExchange:
    """Signed discovery records passed between members (peer exchange).

    ``reply`` asks the receiver to answer with the records it knows.  The
    records are unverified bytes until the receiver's ``verify_record`` says
    otherwise.
    """

    records: tuple[bytes, ...]
    reply: bool = False


def encode_packets(
    packets: Sequence[Packet | Bundle], exchange: PeerExchange | None = None
) -> bytes:
    """One frame body: the protocol version and ``packets``, bundles flattened in order,
    then ``exchange`` if given.

    The packets come from the local core and are trusted; :func:`decode_frame`
    is where the receiver checks them.
    """
    flat: list[_Cbor] = []
    for p in packets:
        if isinstance(p, Bundle):
            flat.extend(_packet(q) for q in p.packets)
        else:
            flat.append(_packet(p))
    if exchange is None:
        return cbor2.dumps([PROTOCOL_VERSION, flat])
    records: list[_Cbor] = list(exchange.records)
    return cbor2.dumps([PROTOCOL_VERSION, flat, [exchange.reply, records]])


def frame(body: bytes) -> bytes:
    """``body`` behind its 4-byte big-endian length prefix."""
    if len(body) >= 1 << (8 * PREFIX_BYTES):
        raise WireError(f"frame body of {len(body)} bytes does not fit the length prefix")
    return len(body).to_bytes(PREFIX_BYTES, "big") + body


# ------------------------------------------------------------------ decoding


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
    mid, payload, deps, op_deps, prev = _array(v, "message", 5)
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
    )


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
        _, rid, topic, op, dests = _array(raw, "UNS", 5)
        return Uns(_d_round(rid), _d_topic(topic, lim), _d_op(op, "UNS.op"), _d_dests(dests, lim))
    if tag == _ACK:
        _, rid, topic, view, bounds = _array(raw, "ACK", 5)
        n = lim.max_view_entries
        entries = tuple(_d_op(e, "ACK.view[]") for e in _array(view, "ACK.view", limit=n))
        bnds = []
        for b in _array(bounds, "ACK.bounds", limit=n):
            node, inc, first = _array(b, "ACK.bounds[]", 3)
            bnds.append(
                Bound(
                    _node(node, "bound.node"),
                    _ctr(inc, "bound.incarnation"),
                    _ctr(first, "bound.first_owned"),
                )
            )
        return Ack(_d_round(rid), _d_topic(topic, lim), entries, tuple(bnds))
    raise WireError(f"packet: unknown type tag {tag}")


def decode_packets(body: bytes, limits: WireLimits) -> list[Packet]:
    """The packets of one frame body, in order; :class:`WireError` on any deviation
    (a body with a peer exchange included: see :func:`decode_frame`)."""
    packets, exchange = decode_frame(body, limits)
    if exchange is not None:
        raise WireError("unexpected peer exchange in a packets-only body")
    return packets


def decode_frame(body: bytes, limits: WireLimits) -> tuple[list[Packet], PeerExchange | None]:
    """The packets of one frame body, in order, and its peer exchange if any.

    Raises :class:`WireError` on any deviation; a body holds at least one
    packet or an exchange.
    """
    if len(body) > limits.max_frame:
        raise WireError(f"body of {len(body)} bytes exceeds max_frame={limits.max_frame}")
    _scan(body, limits.max_items)
    try:
        tree: object = cbor2.loads(body, allow_indefinite=False, max_depth=MAX_DEPTH + 1)
    except (cbor2.CBORDecodeError, ValueError) as exc:  # e.g. a text string that is not UTF-8
        raise WireError(f"undecodable body: {exc}") from None
    parts = _array(tree, "body")
    if len(parts) not in (2, 3):
        raise WireError(f"body: expected 2 or 3 elements, got {len(parts)}")
    version = parts[0]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise WireError(
            f"unsupported protocol version {version!r} (this node speaks {PROTOCOL_VERSION})"
        )
    raw = _array(parts[1], "packets", limit=limits.max_packets)
    exchange = _d_exchange(parts[2], limits) if len(parts) == 3 else None
    if not raw and exchange is None:
        raise WireError("frame without packets")
    return [_d_packet(p, limits) for p in raw], exchange


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

    __slots__ = ("_buf", "_failed", "_max_frame")

    def __init__(self, limits: WireLimits) -> None:
        self._max_frame = limits.max_frame
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
                if not 0 < size <= self._max_frame:
                    buf.clear()
                    self._failed = WireError(
                        f"frame length {size} outside [1, max_frame={self._max_frame}]"
                    )
                    raise self._failed
            size = int.from_bytes(buf[:PREFIX_BYTES], "big")
            take = PREFIX_BYTES + size - len(buf)
            buf += view[:take]
            view = view[take:]
            if len(buf) == PREFIX_BYTES + size:
                out.append(bytes(buf[PREFIX_BYTES:]))
                buf.clear()
        return out
